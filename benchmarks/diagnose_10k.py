"""How long `distill diagnose` takes on a run of 10,000 logged steps (target: under 3 s).

Builds a synthetic ROSE-shaped run directory (20 metric keys per step, an eval line and an eval
file of 200 items every 500 steps, rollout samples every 10 steps), then times the CLI end to end
in a fresh process, as a user runs it: interpreter start, imports, loading, rules, report, plots.

    python benchmarks/diagnose_10k.py            # prints the timings; exit 1 if over the target
    python benchmarks/diagnose_10k.py --keep DIR # keep the run dir there for a look

MLflow logging is off (`--no-mlflow`): the synthetic run has no MLflow run, and the upload's cost
(importing mlflow, ~3 s) does not grow with the number of steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

STEPS = 10_000
TARGET_S = 3.0


def build_run(root: Path, steps: int = STEPS) -> Path:
    from distill.config import RunConfig

    run_dir = root / "runs" / "bench-10k"
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "samples").mkdir()
    config = RunConfig().model_dump(mode="json")
    config["method"] = {"name": "rose", "prefix_tokens": 1024, "teacher_max_tokens": 1024}
    config["optim"]["max_steps"] = steps
    config["eval"]["k"] = 8
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "run_id": run_dir.name,
                "status": "FINISHED",
                "domain": "rlve",
                "method": "rose",
                "steps": steps,
                "student": "zoo:student",
                "teacher": "zoo:teacher",
            }
        )
    )
    rng = random.Random(0)
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for s in range(1, steps + 1):
            decay = math.exp(-s / 1500)
            row = {
                "step": s,
                "train/loss": 0.9 + decay + rng.gauss(0, 0.02),
                "train/ce_loss": 0.9 + decay,
                "train/grad_norm": 0.2 + 2 * decay + abs(rng.gauss(0, 0.05)),
                "train/lr": 1e-6,
                "perf/step_time_s": 30 + rng.random(),
                "perf/tokens_per_s": 5000 + rng.random() * 100,
                "perf/gen_time_s": 20.0,
                "perf/teacher_time_s": 8.0,
                "perf/train_time_s": 2.0,
                "student/completion_tokens_mean": 16000 + rng.random() * 2600,
                "student/completion_tokens_max": 31744.0,
                "student/truncation_rate": 0.05 + 0.2 * s / steps,
                "student/prefix_tokens_mean": 1024.0,
                "student/accuracy": 0.3 + rng.random() * 0.1,
                "teacher/ce_target_tokens_mean": 980.0,
                "teacher/ce_target_tokens_max": 1016.0,
                "teacher/ce_target_share": 0.94 + rng.random() * 0.05,
                "teacher/truncation_rate": 0.95,
                "coverage/supervised_share": 0.06,
                "kl/reverse_kl_mean": 0.1 * decay,
            }
            fh.write(json.dumps(row) + "\n")
            if s % 500 == 0 or s == 1:
                step = 0 if s == 1 else s
                avg = 0.65 - 0.05 * step / steps
                metrics = {
                    "avg@8": avg,
                    "pass@8": 0.8 + 0.03 * step / steps,
                    "pass@1": avg,
                    "solved": 160.0,
                    "truncation_rate": 0.1 + 0.1 * step / steps,
                }
                fh.write(
                    json.dumps({"step": step, **{f"eval/aime25/{k}": v for k, v in metrics.items()}}) + "\n"
                )
                rows = [
                    {
                        "id": f"p{i}",
                        "correct": rng.randint(0, 8),
                        "k": 8,
                        "responses": ["..."],
                        "truncated": 0,
                    }
                    for i in range(200)
                ]
                (run_dir / "eval" / f"step-{step}.jsonl").write_text(
                    "\n".join(json.dumps(r) for r in [{"metrics": metrics}, *rows]) + "\n"
                )
            if s % 10 == 0:
                (run_dir / "samples" / f"step-{s}.jsonl").write_text(
                    json.dumps({"student": "... \\boxed{42}", "truncated": False}) + "\n"
                )
    return run_dir


def time_cli(workspace: Path, args: list[str], repeats: int, cpu: list[float] | None = None) -> list[float]:
    """Wall-clock seconds per call; CPU seconds (user + sys of the child) go to `cpu`.

    CPU time is what the command costs on an idle machine; wall time also counts waiting for a
    core on a shared one.
    """
    env = {**os.environ, "DISTILL_WORKSPACE": str(workspace)}
    times = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "distill", "diagnose", "bench-10k", "--no-mlflow", *args],
            env=env,
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode not in (0, 1, 2) or "diagnose bench-10k" not in proc.stdout:
            sys.exit(f"diagnose failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the run under this workspace and keep it")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workspace = args.keep or Path(tmp)
        t0 = time.perf_counter()
        run_dir = build_run(workspace)
        lines = sum(1 for _ in (run_dir / "metrics.jsonl").open())
        print(f"built {run_dir} ({lines} metric lines) in {time.perf_counter() - t0:.1f} s")
        # One warm-up so the OS file cache and matplotlib's font cache are what a second call sees.
        time_cli(workspace, ["--no-plots"], 1)
        medians = {}
        for label, extra in (("with plots", []), ("--no-plots", ["--no-plots"])):
            cpu: list[float] = []
            times = time_cli(workspace, extra, args.repeats, cpu)
            medians[label] = statistics.median(times)
            print(
                f"distill diagnose ({label}): wall median {medians[label]:.2f} s (min {min(times):.2f}), "
                f"CPU median {statistics.median(cpu):.2f} s, over {len(times)} runs"
            )
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    worst = medians["with plots"]
    print(f"target < {TARGET_S:.0f} s wall: {'PASS' if worst < TARGET_S else 'FAIL'}")
    sys.exit(0 if worst < TARGET_S else 1)


if __name__ == "__main__":
    main()
