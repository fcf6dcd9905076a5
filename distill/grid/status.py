"""Following a grid: each cell's SLURM job state beside its run's status and last step, which
cells `--resume` resubmits, and the wait for the grid to end.

SLURM's word comes from `sacct` (the accounting database: every job, also long finished) and,
where a cluster keeps no accounting, from `squeue --states=all` (the jobs slurmctld still holds).
A job neither knows reads UNKNOWN and the cell's run folder decides.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from distill.grid.folder import Grid
from distill.grid.spec import Cell

Say = Callable[[str], None]
# Job states in which the job may still run the cell: `--resume` never resubmits these.
ACTIVE = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
}
QUERY_TIMEOUT_S = 60


def job_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM's state of each job id (`123` or array task `123_4`); UNKNOWN when neither sacct
    nor squeue knows it (any more)."""
    if not job_ids:
        return {}
    jobs = f"--jobs={','.join(sorted({j.split('_')[0] for j in job_ids}))}"
    found = {}
    accounted = _query(["sacct", "--allocations", "--parsable2", "--format=JobID,State", jobs])
    if accounted is not None:
        from submitit.slurm.slurm import SlurmInfoWatcher

        # submitit's reader: a pending array's `123_[2-3%2]` line stands for each of its tasks.
        info = SlurmInfoWatcher().read_info(accounted)
        found = {j: str(v.get("State", "")).split(" ")[0] for j, v in info.items() if v.get("State")}
    if any(j not in found for j in job_ids):
        queued = _query(["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T", jobs])
        for line in (queued or "").splitlines():
            job_id, _, state = line.strip().partition("|")
            if job_id and state and job_id not in found:
                found[job_id] = state
    return {j: found.get(j, "UNKNOWN") for j in job_ids}


def _query(cmd: list[str]) -> str | None:
    """The command's output; None where it fails (a cluster without accounting, say)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


@dataclass(frozen=True)
class CellRow:
    """What `distill grid status` shows of one cell."""

    cell: Cell
    job_id: str  # "-" for a cell no job ran (the local executor, or never submitted)
    job_state: str  # SLURM's state, "-" where no job ran
    run_status: str  # the run folder's: NEW, RUNNING, FINISHED, KILLED, FAILED, DIED
    step: int
    steps: int

    @property
    def active(self) -> bool:
        """Its job may still run it (or, where no job runs it, its run is live)."""
        return self.job_state in ACTIVE or (self.job_id == "-" and self.run_status == "RUNNING")

    @property
    def done(self) -> bool:
        return self.run_status == "FINISHED" and not self.active


def cell_rows(grid: Grid) -> list[CellRow]:
    cells = grid.spec.cells()
    last = {c.label: grid.spec.jobs[c.label][-1] for c in cells if grid.spec.jobs.get(c.label)}
    states = job_states(list(last.values()))
    rows = []
    for cell in cells:
        job_id = last.get(cell.label, "-")
        state = states.get(job_id, "-")
        status = grid.cell_status(cell)
        if status == "RUNNING" and job_id != "-" and state not in ACTIVE:
            status = "DIED"  # its job has ended: nobody writes the run any more
        steps = grid.spec.budgets[cell.domain].steps
        rows.append(CellRow(cell, job_id, state, status, grid.last_step(cell), steps))
    return rows


def to_resubmit(rows: list[CellRow]) -> list[CellRow]:
    """The cells whose job died, timed out, failed or was cancelled (or never ran): never a
    FINISHED cell, never one whose job is still queued or running."""
    return [row for row in rows if row.run_status != "FINISHED" and not row.active]


def describe(row: CellRow) -> str:
    job = f"job {row.job_id} {row.job_state}" if row.job_id != "-" else "no job"
    return f"{row.cell.label}: {job}, run {row.run_status} step {row.step}/{row.steps}"


def tally(rows: list[CellRow]) -> str:
    counts = Counter(row.job_state if row.job_id != "-" else row.run_status for row in rows)
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def wait(grid: Grid, say: Say, poll_s: float = 5.0) -> list[CellRow]:
    """Until no cell's job is queued or running: a line whenever a cell changes (state, status or
    step), so it reads the same on a terminal and in a log file. Returns the last rows."""
    seen: dict[Cell, str] = {}
    started = time.monotonic()
    while True:
        rows = cell_rows(grid)
        changed = [row for row in rows if seen.get(row.cell) != describe(row)]
        if changed:
            elapsed = int(time.monotonic() - started)
            say(f"grid {grid.spec.grid_id} [{elapsed // 60}:{elapsed % 60:02d}] {tally(rows)}")
            for row in changed:
                say(f"  {describe(row)}")
                seen[row.cell] = describe(row)
        if not any(row.active for row in rows):
            return rows
        time.sleep(poll_s)


def conclude(grid: Grid, rows: list[CellRow]) -> bool:
    """Once no cell's job is queued or running: the grid's end status (FINISHED when every cell
    is, else FAILED with each unfinished cell's job and run state); True if it just ended."""
    if any(row.active for row in rows) or grid.spec.status != "RUNNING":
        return False
    grid.spec.failed = {
        row.cell.label: f"job {row.job_id} {row.job_state}, run {row.run_status} at step {row.step}"
        for row in rows
        if row.run_status != "FINISHED"
    }
    grid.spec.status = "FAILED" if grid.spec.failed else "FINISHED"
    grid.save()
    return True
