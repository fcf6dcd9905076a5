"""`distill grid --executor slurm` against a real one-node SLURM (scripts/slurm-local.sh) and a
real MLflow server: a 4-cell grid submitted as one job array; one cell `scancel`ed mid-run and
another signalled as at its time limit (it checkpoints, is requeued and resumes by itself); then
`--resume` resubmits the cancelled cell alone. The finished table equals the same grid run by the
local executor value for value, every cell's final weights are the local cell's bit for bit, and
the MLflow server holds each cell once under the grid's parent run, level with its metrics.jsonl.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .mlflow_level import assert_level
from .test_grid import _grid_overrides, _train_steps
from .test_run import _env
from .test_tracking_server import MlflowServer

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-local.sh"
CELLS = ["rlve/sft/s0", "rlve/sft/s1", "rlve/opd/s0", "rlve/opd/s1"]
# SLURM's signal window, the longest the signalled cell may take to its next step boundary: the
# signal comes while it is still starting up (a busy 2-core machine has taken over 105 s).
SLURM = ["slurm.time_min=30", "slurm.signal_delay_s=600"]


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[None]:
    """The one-node cluster, started here unless it is up already (then left as it was)."""
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("no SLURM here and no apt-get to install it (scripts/slurm-local.sh install)")
    running = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True).returncode == 0
    if not running:
        start = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
        if start.returncode != 0:
            pytest.skip(f"no one-node SLURM: {(start.stdout + start.stderr).strip().splitlines()[-1:]}")
    yield
    if not running:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start(timeout=900)  # a busy 2-core machine has taken over 3 minutes
    yield server
    server.stop()


def _distill(args: list[str], env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _until(what: str, check, timeout: float = 600, every: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def _weights(ws: Path, grid: str, cell: str) -> bytes:
    run = ws / "runs" / f"{grid}-{cell.replace('/', '-')}"
    return (run / "checkpoints" / "step-6" / "model.safetensors").read_bytes()


def test_a_grid_on_slurm_ends_with_the_local_grids_table(
    slurm_cluster: None, server: MlflowServer, tiny_zoo, tmp_path: Path
) -> None:
    grid = ["grid", "--domain", "rlve", "--method", "sft,opd", "--seeds", "2", *_grid_overrides(tiny_zoo)]
    grid.append("eval.every_steps=3")
    local_ws, ws = tmp_path / "local", tmp_path / "slurm"
    # The local executor's grid, alongside (its own workspace and embedded store).
    local = subprocess.Popen(
        [sys.executable, "-m", "distill", *grid, "--name", "L", "--parallel", "2"],
        env=_env(local_ws),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    env = {**_env(ws), "DISTILL_TRACKING_URI": server.uri}
    began = time.time()
    submitted = _distill([*grid, "--name", "S", "--executor", "slurm", *SLURM], env, timeout=300)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    jobs = json.loads((ws / "grids" / "S" / "grid.json").read_text())["jobs"]
    ids = {cell: jobs[cell][-1] for cell in CELLS}
    array = {i.split("_")[0] for i in ids.values()}
    assert len(array) == 1 and sorted(i.split("_")[1] for i in ids.values()) == ["0", "1", "2", "3"], ids
    for cell in CELLS:
        assert f"{cell}: job {ids[cell]}, starting S-{cell.replace('/', '-')}" in submitted.stdout

    runs = ws / "runs"
    # The array's tasks start in SLURM's order, not the test's, and a tiny cell runs its 6 steps in
    # about a second: one loop watches every cell and acts on the first it finds in each state.
    # As at its time limit (SLURM's `--signal`, which submitit's own `_interrupt` sends the same
    # way): the first cell whose run exists, still in its step-0 evals; it checkpoints at its next
    # step boundary and is requeued. Cancelled: another cell past its step-2 checkpoint, during its
    # step-3 eval (eval.every_steps=3 holds it there a moment), before its end.
    requeued = cancelled = ""
    first_step = 0.0

    def act() -> bool:
        nonlocal requeued, cancelled, first_step
        for cell in CELLS:
            run = runs / f"S-{cell.replace('/', '-')}"
            steps = _train_steps(run)
            if not requeued and (run / "summary.json").exists() and not steps:
                requeued, first_step = cell, time.time() - began
                # (SLURM 22.05's scancel may answer "Job can not be altered now" for an array task
                # it did signal.)
                subprocess.Popen(["scancel", "--signal=USR2", ids[cell]], stderr=subprocess.DEVNULL)
            elif not cancelled and cell != requeued and steps and 3 <= max(steps) < 6:
                cancelled = cell
                subprocess.run(["scancel", ids[cell]], check=True)
        return bool(requeued and cancelled)

    _until("a cell to requeue and one to cancel", act, every=0.02)
    finished = [c for c in CELLS if c not in (requeued, cancelled)]

    waited = _distill(["grid", "status", "S", "--wait"], env)
    assert waited.returncode == 1, waited.stdout[-3000:]  # one cell did not finish
    # The progress lines, the last one of each cell: "  rlve/opd/s0: job 12_2 CANCELLED, run DIED step 3/6".
    final = {
        line.split(":")[0].strip(): line for line in waited.stdout.splitlines() if line.startswith("  rlve/")
    }
    assert f"job {ids[cancelled]} CANCELLED, run DIED step " in final[cancelled], final
    for cell in (*finished, requeued):
        assert f"job {ids[cell]} COMPLETED, run FINISHED step 6/6" in final[cell], final
    name = {cell: f"S-{cell.replace('/', '-')}" for cell in CELLS}
    log_of = {cell: (ws / "grids" / "S" / "logs" / f"{name[cell]}.log") for cell in CELLS}
    requeue_log = log_of[requeued].read_text()
    assert requeue_log.count(f"job {ids[requeued]} on ") == 2, requeue_log[-3000:]  # the same job, requeued
    assert "(time limit or preemption): run exited 130; requeued" in requeue_log
    # The run says why it stopped: a requeue, not a kill.
    assert "the requeued job continues it with --resume" in requeue_log and "interrupted;" not in requeue_log
    assert f"resuming {name[requeued]} from step-" in requeue_log

    resumed_at = time.time()
    again = _distill(["grid", "--resume", "S", "--wait"], env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "grid S: 1 of 4 cells to submit" in again.stdout
    for cell in (*finished, requeued):
        assert f"grid {cell}: FINISHED, kept" in again.stdout
    assert f"{cancelled}: job " in again.stdout and "resuming (DIED, step " in again.stdout
    assert f"resuming {name[cancelled]} from step-" in log_of[cancelled].read_text()
    assert _train_steps(runs / name[cancelled]) == [1, 2, 3, 4, 5, 6]  # no step twice
    resubmitted = time.time() - resumed_at

    assert local.wait(timeout=900) == 0, local.stdout.read()[-3000:] if local.stdout else ""
    # Value for value, and the weights behind them bit for bit (the requeued cell's too).
    assert (ws / "grids" / "S" / "table.csv").read_text() == (
        local_ws / "grids" / "L" / "table.csv"
    ).read_text()
    for cell in CELLS:
        assert _weights(ws, "S", cell) == _weights(local_ws, "L", cell), cell

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.uri)
    exp = client.get_experiment_by_name("distill")
    active = client.search_runs([exp.experiment_id])
    parents = [r for r in active if r.data.tags.get("distill.grid") == "S"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in active if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.info.run_name for r in children) == sorted(f"S-{c.replace('/', '-')}" for c in CELLS)
    for cell in CELLS:
        assert_level(client, runs / f"S-{cell.replace('/', '-')}")
    print(
        f"\nslurm grid: first cell running {first_step:.1f} s after submission, resubmission {resubmitted:.1f} s"
    )


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("slurm.partition=nope", "slurm.partition: 'nope' is no partition of this cluster (debug)"),
        # SLURM's own refusal (`sbatch --test-only` on submitit's script): no GPUs on this node.
        ("slurm.gpus_per_node=1", "slurm.gpus_per_node: SLURM refuses the cells' job: "),
    ],
)
def test_what_slurm_refuses_is_one_line_and_nothing_is_submitted(
    slurm_cluster: None, setting: str, words: str, tmp_path: Path
) -> None:
    env = {**_env(tmp_path / "ws"), "DISTILL_TRACKING_URI": "http://127.0.0.1:9"}  # never reached
    before = subprocess.run(["squeue", "--noheader", "--states=all"], capture_output=True, text=True).stdout
    proc = _distill(["grid", "--method", "opd", "--executor", "slurm", setting], env, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "ws").exists()
    after = subprocess.run(["squeue", "--noheader", "--states=all"], capture_output=True, text=True).stdout
    assert after == before  # no job
