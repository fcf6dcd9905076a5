"""`distill grid` end to end on a reduced grid: SIGKILL in the middle of a cell, then `--resume`.

Real subprocesses, the real MLflow store: the finished cell is kept, the killed one continues from
its last checkpoint in a cell process (each step once in its metrics.jsonl), one parent MLflow run holds one child per
cell, and `distill compare --grid` prints the table the grid wrote.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_run import _env, _overrides

pytestmark = pytest.mark.integration


def _grid_overrides(tiny_zoo) -> list[str]:
    # The run tests' tiny budget (optim.batch_size 8 = 4 prompts x 2 samples: SFT's matched budget).
    return [
        *_overrides(tiny_zoo, steps=6, every=2),
        # The tiny teacher rarely finishes inside 24 tokens: SFT takes its trajectories unverified.
        "sft:method.keep_verified_only=false",
    ]


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in rows if "train/loss" in r]


def test_grid_killed_mid_cell_resumes_to_one_table(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "distill", "grid", "--domain", "rlve", "--method", "sft,opd", "--name", "g"]
    log = tmp_path / "grid.log"  # a file, not a pipe: nobody reads a pipe until the kill
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, *_grid_overrides(tiny_zoo)], env=_env(ws), stdout=out, stderr=subprocess.STDOUT, text=True
        )
    opd = ws / "runs" / "g-rlve-opd-s0"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if any(s >= 3 for s in _train_steps(opd)):  # past its step-2 checkpoint, before its end
            break
        time.sleep(0.02)  # a tiny step takes ~0.1 s: a coarse poll could miss the run's last steps
    assert proc.poll() is None, log.read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = log.read_text()
    # Off a terminal every line of a cell, its step lines too, names the cell.
    assert "[rlve/sft/s0] step 6/6" in first and "grid cell 2/2 rlve/opd/s0: starting" in first
    assert json.loads((opd / "summary.json").read_text())["status"] == "RUNNING"  # as SIGKILL left it

    done = subprocess.run(
        # The rest in cell processes (`--parallel`): `distill run --resume` for the killed cell.
        [sys.executable, "-m", "distill", "grid", "--resume", "g", "--parallel", "2"],
        env=_env(ws),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rlve/sft/s0: FINISHED, kept" in done.stdout
    assert "grid cell 2/2 rlve/opd/s0: resuming (DIED)" in done.stdout
    log = (ws / "grids" / "g" / "logs" / "g-rlve-opd-s0.log").read_text()
    # From its last checkpoint before the kill (step 2, or step 4 when the kill came late).
    assert re.search(r"resuming g-rlve-opd-s0 from step-[24]\b", log), log[-2000:]
    assert sorted(p.name for p in (ws / "runs").iterdir()) == ["g-rlve-opd-s0", "g-rlve-sft-s0"]
    assert _train_steps(opd) == [1, 2, 3, 4, 5, 6]  # no step twice
    grid = json.loads((ws / "grids" / "g" / "grid.json").read_text())
    assert grid["status"] == "FINISHED" and grid["failed"] == {}
    table = (ws / "grids" / "g" / "table.md").read_text()
    for row in ("student (before)", "sft", "opd", "teacher"):
        assert f"| {row} | " in table
    assert "| opd | - |" not in table  # both cells have their final eval
    assert (ws / "grids" / "g" / "grid.png").stat().st_size > 5000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(ws / 'mlflow.db').resolve()}")
    exp = client.get_experiment_by_name("distill")
    active = client.search_runs([exp.experiment_id])
    parents = [r for r in active if r.data.tags.get("distill.grid") == "g"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    children = [r for r in active if r.data.tags.get("mlflow.parentRunId") == parent]
    assert sorted(r.info.run_name for r in children) == ["g-rlve-opd-s0", "g-rlve-sft-s0"]
    assert {r.info.status for r in children} == {"FINISHED"}
    # MLflow takes no "@" in a metric name (avg@1 is stored as avg_at_1).
    assert parents[0].data.metrics["grid/rlve/opd/avg_at_1"] == pytest.approx(
        json.loads((opd / "summary.json").read_text())["student_after"]["avg@1"]
    )
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"table.md", "table.csv", "grid.png", "grid.json"} <= artifacts

    again = subprocess.run(
        [sys.executable, "-m", "distill", "compare", "--grid", "g"],
        env=_env(ws),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and (ws / "grids" / "g" / "table.md").read_text() == table
    assert "rlve/opd/s0" in again.stdout and "FINISHED" in again.stdout
