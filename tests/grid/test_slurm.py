"""The SLURM executor's refusals before anything is written: a time limit that leaves no time before
the checkpoint window, a tracking store that cannot take writers from many nodes, no sbatch on
PATH; one line each, naming the field. (The unknown partition needs a cluster:
tests/e2e/test_grid_slurm.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distill.grid.settings import SlurmSettings
from distill.grid.slurm import check
from distill.grid.spec import GridRefused, plan
from distill.settings import Settings


def _check(tmp_path: Path, slurm: SlurmSettings, tracking_uri: str | None, overrides: list[str] = ()) -> str:
    spec = plan("rlve", "opd", 1, list(overrides), [], "g", [], slurm)
    settings = Settings(workspace=tmp_path / "ws", tracking_uri=tracking_uri)
    with pytest.raises(GridRefused) as info:
        check(spec, settings)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "ws").exists()
    return str(info.value)


def test_a_time_limit_inside_the_checkpoint_window(tmp_path: Path) -> None:
    text = _check(tmp_path, SlurmSettings(time_min=2, signal_delay_s=120), "http://127.0.0.1:5000")
    assert text.startswith("slurm.time_min: 2 min leaves no time") and "signal_delay_s=120" in text


def test_sqlite_or_file_stores_are_refused(tmp_path: Path) -> None:
    text = _check(tmp_path, SlurmSettings(), None)  # the workspace's embedded sqlite store
    assert text.startswith("DISTILL_TRACKING_URI: sqlite:///") and "MLflow server" in text
    text = _check(
        tmp_path, SlurmSettings(), "http://127.0.0.1:5000", ["tracking.uri=sqlite:////shared/mlflow.db"]
    )
    assert text.startswith("rlve/opd/s0: tracking.uri: sqlite:////shared/mlflow.db is a file store")


def test_no_sbatch_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    text = _check(tmp_path, SlurmSettings(), "http://127.0.0.1:5000")
    assert text.startswith("--executor slurm: no sbatch on PATH")


def test_cli_refuses_in_one_line_and_submits_nothing(tmp_path: Path) -> None:
    env = {
        "DISTILL_WORKSPACE": str(tmp_path / "ws"),
        "DISTILL_TRACKING_URI": "http://127.0.0.1:9",
        "PATH": str(tmp_path),  # no sbatch
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "distill", "grid", "--method", "opd", "--executor", "slurm"]
    proc = subprocess.run([*cmd, "slurm.time_min=5"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "no sbatch on PATH" in proc.stderr
    assert not (tmp_path / "ws").exists()
