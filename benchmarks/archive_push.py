"""What `distill archive push` of a 500 MB checkpoint costs against a bare `dvc add` + `dvc push` of
the same folder (target: at most 1.5x), both to a local-folder remote, both as a user runs them:
a fresh process each, interpreter start and imports included.

The run is checkpoint-like: `checkpoints/step-100/` with a 167 MB `model.safetensors`, a 333 MB
`optimizer.pt` (Adam keeps two moments per weight) and the small JSON files a trainer writes, in a
finished run directory with a real MLflow run (the push tags it and uploads the manifest), its
materialised prompt sets already in the workspace (the run made them). Random bytes: nothing
compresses or deduplicates.

    python benchmarks/archive_push.py              # 3 rounds, prints a table and JSON
    python benchmarks/archive_push.py --rounds 1 --dir /big/disk/tmp

The bare baseline is measured twice: with DVC's default cache link type (`reflink,copy`: a copy
on ext4) and with `hardlink`, the link type distill configures in the workspace's own repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL_BYTES = 167_000_000
OPTIMIZER_BYTES = 333_000_000
TARGET_RATIO = 1.5
BIN = Path(sys.executable).parent


def _write_random(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        left = size
        while left:
            chunk = min(left, 16 << 20)
            fh.write(os.urandom(chunk))
            left -= chunk


def make_checkpoints(folder: Path) -> None:
    step = folder / "step-100"
    step.mkdir(parents=True)
    _write_random(step / "model.safetensors", MODEL_BYTES)
    _write_random(step / "optimizer.pt", OPTIMIZER_BYTES)
    for name, text in {
        "config.json": '{"architectures": ["Qwen3ForCausalLM"]}',
        "generation_config.json": "{}",
        "trainer_state.json": '{"global_step": 100}',
        "tokenizer.json": "{}",
    }.items():
        (step / name).write_text(text)
    _write_random(step / "rng_state.pth", 15_000)
    _write_random(step / "scheduler.pt", 1_500)


def make_run(workspace: Path, checkpoints: Path, with_mlflow: bool = True) -> Path:
    """A finished run around `checkpoints` (moved in), with an MLflow run and materialised data."""
    os.environ["DISTILL_WORKSPACE"] = str(workspace)
    from distill.config import RunConfig, dump_config
    from distill.domains import build_domain
    from distill.domains.rlve.config import RLVEDomainConfig
    from distill.settings import get_settings
    from distill.tracking.mlflow import open_tracker

    settings = get_settings()
    config = RunConfig(domain=RLVEDomainConfig(train_size=256, eval_size=64))
    run_dir = settings.runs_dir / "bench-500mb"
    run_dir.mkdir(parents=True)
    dump_config(config, run_dir / "config.yaml")
    shutil.move(str(checkpoints), run_dir / "checkpoints")
    domain = build_domain(config.domain)
    domain.train_items(), domain.eval_items()
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "step-100.jsonl").write_text('{"metrics": {"accuracy": 0.5}}\n')
    (run_dir / "samples").mkdir()
    (run_dir / "samples" / "step-1.jsonl").write_text('{"prompt": "p", "student": "s"}\n')
    tracker = open_tracker(
        settings.resolved_tracking_uri, "bench", settings.artifact_root, run_name=run_dir.name
    )
    tracker.finish()
    manifest = {"config": config.model_dump(mode="json"), "mlflow_run_id": tracker.run_id}
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    summary = {"run_id": run_dir.name, "status": "FINISHED"}
    if with_mlflow:
        summary.update(mlflow_run_id=tracker.run_id, tracking_uri=settings.resolved_tracking_uri)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def distill_push(root: Path, env: dict[str, str], with_mlflow: bool = True) -> float:
    workspace = root / "ws"
    make_checkpoints(root / "ckpt")
    make_run(workspace, root / "ckpt", with_mlflow)
    env = {**env, "DISTILL_WORKSPACE": str(workspace), "DISTILL_REMOTE": str(root / "remote")}
    return _timed([str(BIN / "distill"), "archive", "push", "bench-500mb"], root, env)


def bare_push(root: Path, env: dict[str, str], cache_type: str | None) -> tuple[float, float]:
    repo = root / "bare"
    make_checkpoints(repo / "checkpoints")
    dvc = str(BIN / "dvc")
    _timed([dvc, "init", "--no-scm", "-q"], repo, env)
    _timed([dvc, "remote", "add", "-d", "local", str(root / "remote")], repo, env)
    if cache_type:
        _timed([dvc, "config", "cache.type", cache_type], repo, env)
    add = _timed([dvc, "add", "checkpoints"], repo, env)
    push = _timed([dvc, "push"], repo, env)
    return add, push


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder (needs ~2 GB free)")
    args = parser.parse_args()
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("DISTILL_REMOTE", None)
    results: dict[str, list[float]] = {
        "distill": [],
        "distill_no_mlflow": [],
        "bare_default": [],
        "bare_hardlink": [],
    }
    parts: dict[str, list[float]] = {
        "default_add": [],
        "default_push": [],
        "hardlink_add": [],
        "hardlink_push": [],
    }
    for _ in range(args.rounds):
        # Interleaved, each in a fresh folder, so machine load and page cache hit all three alike.
        for kind in results:
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                root = Path(tmp)
                if kind.startswith("distill"):
                    results[kind].append(distill_push(root, env, with_mlflow=kind == "distill"))
                else:
                    cache = "hardlink" if kind == "bare_hardlink" else None
                    add, push = bare_push(root, env, cache)
                    label = "hardlink" if cache else "default"
                    parts[f"{label}_add"].append(add)
                    parts[f"{label}_push"].append(push)
                    results[kind].append(add + push)
    med = {k: statistics.median(v) for k, v in {**results, **parts}.items()}

    def row(label: str, key: str) -> None:
        print(f"| {label} | {med[key]:.2f} | {', '.join(f'{x:.2f}' for x in {**results, **parts}[key])} |")

    print("| what | median s | all rounds s |")
    print("|---|---|---|")
    row("`distill archive push` (run dir, 500 MB checkpoint, MLflow tags)", "distill")
    row("`distill archive push`, the same run without an MLflow run", "distill_no_mlflow")
    row("bare `dvc add` + `dvc push`, DVC's default cache type", "bare_default")
    row("- of which `dvc add`", "default_add")
    row("- of which `dvc push`", "default_push")
    row("bare `dvc add` + `dvc push`, `cache.type hardlink`", "bare_hardlink")
    row("- of which `dvc add`", "hardlink_add")
    row("- of which `dvc push`", "hardlink_push")
    ratio_default = med["distill"] / med["bare_default"]
    ratio_hardlink = med["distill"] / med["bare_hardlink"]
    print(f"\nratio vs bare default: {ratio_default:.2f}x; vs bare hardlink: {ratio_hardlink:.2f}x")
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} CPUs")
    print(json.dumps({"rounds": args.rounds, "results": results, "parts": parts}, indent=None))
    if max(ratio_default, ratio_hardlink) > TARGET_RATIO:
        sys.exit(1)


if __name__ == "__main__":
    main()
