"""`distill run` refuses before it writes: a run name that is not one folder, a `--resume` of no
run, a second writer of a live run; `--resume` of a FINISHED run is a one-line no-op. No model is
loaded: each case is a `distill` process that must stop in a second or two."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distill.config import dump_config, resolve_config
from distill.settings import Settings
from distill.tracking.rundir import RunDir


def _distill(args: list[str], workspace: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DISTILL_WORKSPACE=str(workspace), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _one_error_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_run_name_with_a_path_in_it_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for name in ("../../escaped-run", "a/b", ".hidden"):
        proc = _distill(["run", "--domain", "rlve", "--method", "opd", f"tracking.run_name={name}"], ws)
        _one_error_line(proc, "tracking.run_name")
    assert not ws.exists() and not (tmp_path / "escaped-run").exists()


@pytest.mark.parametrize("ref", ["/x/y", "does-not-exist", "../elsewhere"])
def test_resume_of_no_run_is_one_line_and_writes_nothing(tmp_path: Path, ref: str) -> None:
    ws = tmp_path / "ws"
    line = _one_error_line(_distill(["run", "--resume", ref], ws), ref)
    assert "error.log" not in line
    assert not ws.exists()


@pytest.fixture
def made_run(tmp_path: Path) -> RunDir:
    """A run directory as a run leaves it (no model needed to refuse or skip it)."""
    settings = Settings(workspace=tmp_path / "ws")
    run = RunDir.create(settings.runs_dir, "r1")
    dump_config(resolve_config("rlve", "opd"), run.config)
    run.metrics.write_text(
        "".join(json.dumps({"step": s, "train/loss": 1.0 / s}) + "\n" for s in range(1, 7))
    )
    (run.checkpoint(2)).mkdir(parents=True)
    return run


HOLDER = textwrap.dedent(
    """
    import sys, time
    from distill.tracking.lock import RunLock
    from distill.tracking.rundir import RunDir
    lock = RunLock.acquire(RunDir(sys.argv[1]))
    print("held", flush=True)
    time.sleep(120)
    """
)


def test_resume_of_a_run_another_live_process_writes_is_refused(made_run: RunDir) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(made_run.path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        made_run.write_summary({"status": "RUNNING", "pid": holder.pid, "run_dir": str(made_run.path)})
        before = _snapshot(made_run.path)
        proc = _distill(["run", "--resume", "r1"], made_run.path.parents[1])
        _one_error_line(proc, "r1", f"pid {holder.pid}", "being written")
        # Nothing touched: metrics.jsonl not trimmed to the checkpoint, summary as it was.
        assert _snapshot(made_run.path) == before
        listed = json.loads(_distill(["runs", "--json"], made_run.path.parents[1]).stdout)
        assert [s["status"] for s in listed] == ["RUNNING"]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    listed = json.loads(_distill(["runs", "--json"], made_run.path.parents[1]).stdout)
    assert [s["status"] for s in listed] == ["DIED"]


def test_resume_of_a_finished_run_is_a_one_line_no_op(made_run: RunDir) -> None:
    made_run.write_summary(
        {"status": "FINISHED", "run_id": "r1", "mlflow_run_id": "x", "run_dir": str(made_run.path)}
    )
    before = _snapshot(made_run.path)
    proc = _distill(["run", "--resume", "r1"], made_run.path.parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        "run r1 is FINISHED; nothing to resume (`distill runs`, `distill diagnose r1`)"
    ]
    assert _snapshot(made_run.path) == before
    assert not (made_run.path.parents[1] / "mlflow.db").exists()  # no MLflow run opened either


def test_a_run_argument_to_runs_needs_repair(tmp_path: Path) -> None:
    _one_error_line(_distill(["runs", "r1"], tmp_path / "ws"), "--repair")
    proc = _distill(["runs", "--repair", "nope"], tmp_path / "ws")
    _one_error_line(proc, "no run 'nope'")
