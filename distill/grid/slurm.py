"""The SLURM executor: each cell one job, submitted through submitit (one job array per
submission), each job running the cell's launcher inside its allocation (`cell_job.CellJob`).

Everything that can be checked is checked before the grid folder or its MLflow run exists:
`sbatch` on PATH, the partition, the time limit against the checkpoint window, a tracking store
that takes writers from many nodes, and the job itself (`sbatch --test-only` on the very script
submitit submits). Each refusal is one line naming the field.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from distill.grid.cell_job import CellJob, CellSpec
from distill.grid.folder import Grid
from distill.grid.settings import REQUEUE_SIGNAL, SlurmSettings
from distill.grid.spec import Cell, GridRefused, GridSpec, cell_config
from distill.grid.status import cell_rows, to_resubmit
from distill.tracking.mlflow import client_for

if TYPE_CHECKING:
    from distill.settings import Settings

Say = Callable[[str], None]
# Stores MLflow writes to through a server or a database that takes concurrent writers.
SAFE_STORES = ("http://", "https://", "postgresql", "mysql", "mssql", "databricks")
# What the job needs after the signal besides the run's own checkpoint: requeueing, exiting.
REQUEUE_MARGIN_S = 15
SLURM_TIMEOUT_S = 60


def check_tracking(uri: str, where: str) -> None:
    """Cells on several nodes write at once: a SQLite file (or a file store) on a shared
    filesystem is not safe for that; an MLflow server (or a database server) is."""
    if uri.startswith(SAFE_STORES):
        return
    raise GridRefused(
        f"{where}: {uri} is a file store; cells on SLURM nodes write at once, which a SQLite file or "
        "file store on a shared filesystem does not take: start an MLflow server "
        "(docs/grid.md, On a cluster) and set DISTILL_TRACKING_URI=http://<host>:<port>"
    )


def check(spec: GridSpec, settings: Settings) -> None:
    """Everything the SLURM executor can check before anything is written (GridRefused otherwise)."""
    slurm = spec.slurm
    assert slurm is not None
    if slurm.time_min * 60 <= slurm.signal_delay_s + REQUEUE_MARGIN_S:
        raise GridRefused(
            f"slurm.time_min: {slurm.time_min} min leaves no time to train before the checkpoint window "
            f"(slurm.signal_delay_s={slurm.signal_delay_s} s before the limit, plus {REQUEUE_MARGIN_S} s "
            "to requeue); give a longer time limit or a shorter window"
        )
    if slurm.accelerate_config is not None and not slurm.accelerate_config.is_file():
        raise GridRefused(f"slurm.accelerate_config: no such file {slurm.accelerate_config}")
    check_tracking(settings.resolved_tracking_uri, "DISTILL_TRACKING_URI")
    for cell in spec.cells():
        uri = cell_config(spec, cell).tracking.uri
        if uri is not None:
            check_tracking(uri, f"{cell.label}: tracking.uri")
    if shutil.which("sbatch") is None:
        raise GridRefused(
            "--executor slurm: no sbatch on PATH (run it on a SLURM login node; "
            "scripts/slurm-local.sh start brings up a one-node cluster on this machine)"
        )
    if slurm.partition is not None:
        partitions = _run(["sinfo", "--noheader", "--format=%R"]).split()
        if slurm.partition not in partitions:
            known = ", ".join(sorted(set(partitions))) or "none"
            raise GridRefused(
                f"slurm.partition: {slurm.partition!r} is no partition of this cluster ({known})"
            )
    _test_only(slurm)


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GridRefused(f"--executor slurm: {cmd[0]} did not answer ({type(exc).__name__})") from None
    if proc.returncode != 0:
        raise GridRefused(f"--executor slurm: {cmd[0]}: {_first_error(proc.stderr)}")
    return proc.stdout


def _first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines or ["no answer"]
    return errors[-1].removeprefix("sbatch: error: ")


# Words of sbatch's refusals -> the setting they are about.
_FIELDS = {
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "gres": "slurm.gpus_per_node",
    "memory": "slurm.mem_gb",
    "node count": "slurm.nodes",
    "time limit": "slurm.time_min",
    "cpu": "slurm.cpus_per_task",
}


def _test_only(slurm: SlurmSettings) -> None:
    """`sbatch --test-only` on the job script submitit would submit: SLURM's own word on the
    account, QOS, GPUs, memory and limits, with nothing queued."""
    from submitit.slurm.slurm import _make_sbatch_string

    with tempfile.TemporaryDirectory(prefix="distill-sbatch-") as tmp:
        script = Path(tmp) / "cell.sh"
        script.write_text(_make_sbatch_string(command="true", folder=tmp, **slurm.parameters()))
        proc = subprocess.run(
            ["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S
        )
    if proc.returncode == 0:
        return
    error = _first_error(proc.stderr)
    lowered = error.lower()
    name = next((f for word, f in _FIELDS.items() if word in lowered), "slurm")
    raise GridRefused(f"{name}: SLURM refuses the cells' job: {error}")


def submit_cells(grid: Grid, resuming: bool, say: Say) -> None:
    """Submit every cell (a new grid), or on `--resume` the cells whose job died, timed out,
    failed or was cancelled: never a FINISHED cell, never one still queued or running."""
    rows = cell_rows(grid)
    todo = to_resubmit(rows) if resuming else rows
    for row in rows:
        if row not in todo:
            why = "FINISHED" if row.run_status == "FINISHED" else f"job {row.job_id} {row.job_state}"
            say(f"grid {row.cell.label}: {why}, kept")
    say(f"grid {grid.spec.grid_id}: {len(todo)} of {len(rows)} cells to submit")
    if todo:
        ids = submit(grid, [row.cell for row in todo])
        cells = grid.spec.cells()
        for row in todo:
            how = "starting" if row.run_status == "NEW" else f"resuming ({row.run_status}, step {row.step})"
            n = cells.index(row.cell) + 1
            say(
                f"grid cell {n}/{len(cells)} {row.cell.label}: job {ids[row.cell]}, {how} {grid.spec.run_id(row.cell)}"
            )
    client_for(grid.spec.tracking_uri).update_run(str(grid.spec.mlflow_run_id), status="RUNNING")
    grid.spec.status = "RUNNING"
    grid.save()


def submit(grid: Grid, cells: list[Cell]) -> dict[Cell, str]:
    """The cells as one job array (one job for a single cell); their job ids, recorded."""
    import submitit

    slurm = grid.spec.slurm
    assert slurm is not None
    folder = grid.path / "slurm" / "%j"
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=slurm.max_requeues, python=slurm.python)
    executor.update_parameters(job_name=grid.spec.grid_id, **slurm.parameters())
    (grid.path / "logs").mkdir(exist_ok=True)
    specs = [cell_spec(grid, cell) for cell in cells]
    with executor.batch():
        jobs = [executor.submit(CellJob(spec)) for spec in specs]
    ids = {cell: str(job.job_id) for cell, job in zip(cells, jobs, strict=True)}
    for cell, job_id in ids.items():
        grid.spec.jobs.setdefault(cell.label, []).append(job_id)
    grid.save()
    return ids


def cell_spec(grid: Grid, cell: Cell) -> CellSpec:
    slurm = grid.spec.slurm
    assert slurm is not None
    return CellSpec(
        label=cell.label,
        run_id=grid.spec.run_id(cell),
        run_args=grid.run_args(cell),
        workspace=str(grid.settings.workspace.resolve()),
        tracking_uri=grid.spec.tracking_uri,
        log=str(grid.log(cell).resolve()),
        python=slurm.python or CellSpec.python,
        launcher=slurm.launcher,
        nodes=slurm.nodes,
        processes=slurm.processes(),
        accelerate_config=str(slurm.accelerate_config.resolve()) if slurm.accelerate_config else None,
        signal_name=REQUEUE_SIGNAL,
        grace_s=max(5.0, slurm.signal_delay_s - REQUEUE_MARGIN_S),
    )
