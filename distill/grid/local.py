"""The local executor: the cells on this machine, one after another in this process, or
`--parallel N` at a time, each a `distill run` process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

from distill.grid.folder import Grid
from distill.grid.spec import Cell, GridRefused, cell_config
from distill.launch import set_parent_death_signal
from distill.runner import execute
from distill.tracking.mlflow import client_for

Say = Callable[[str], None]


def run_cells(grid: Grid, parallel: int, say: Say) -> None:
    """Every cell not FINISHED, one after another (or `parallel` at a time, each in its own
    process). A cell that fails is recorded and the others go on; Ctrl-C stops the grid."""
    todo: dict[Cell, str] = {}
    cells = grid.spec.cells()
    for cell in cells:
        status = grid.cell_status(cell)
        if status == "RUNNING":
            raise GridRefused(f"cell {cell.label} is RUNNING in another process; wait for it or stop it")
        if status == "FINISHED":
            say(f"grid {cell.label}: FINISHED, kept ({grid.spec.run_id(cell)})")
        else:
            todo[cell] = "starting" if status == "NEW" else f"resuming ({status})"
    say(f"grid {grid.spec.grid_id}: {len(todo)} of {len(cells)} cells to run")
    client_for(grid.spec.tracking_uri).update_run(str(grid.spec.mlflow_run_id), status="RUNNING")
    grid.spec.status = "RUNNING"
    grid.save()
    # Said as each cell starts: "grid cell 3/8 rlve/opd/s0: starting <run id>".
    announce = {
        cell: f"grid cell {cells.index(cell) + 1}/{len(cells)} {cell.label}: {how} {grid.spec.run_id(cell)}"
        for cell, how in todo.items()
    }
    if parallel > 1:
        _run_processes(grid, list(todo), parallel, lambda cell: say(announce[cell]), say)
    else:
        for cell in todo:
            say(announce[cell])
            _run_here(grid, cell, say)
    grid.spec.status = "FAILED" if grid.spec.failed else "FINISHED"
    grid.save()


def _run_here(grid: Grid, cell: Cell, say: Say) -> None:
    config = cell_config(grid.spec, cell) if grid.cell_status(cell) == "NEW" else None
    prefix = f"[{cell.label}] "
    try:
        execute(
            config,
            grid.settings,
            argv=grid.spec.argv,
            resume=None if config is not None else grid.spec.run_id(cell),
            say=lambda line: say(prefix + line),
        )
        grid.spec.failed.pop(cell.label, None)
    except KeyboardInterrupt:
        grid.spec.status = "KILLED"
        grid.save()
        raise
    except Exception as exc:  # one failed cell does not end the grid
        grid.spec.failed[cell.label] = f"{type(exc).__name__}: {exc}"
        say(f"grid {cell.label}: FAILED ({type(exc).__name__}: {exc}); the other cells go on")
    grid.save()


def _run_processes(
    grid: Grid, cells: list[Cell], parallel: int, starting: Callable[[Cell], None], say: Say
) -> None:
    """`distill run` per cell, `parallel` at a time; each writes `<grid>/logs/<run id>.log`."""
    lock = threading.Lock()
    queue = list(cells)
    (grid.path / "logs").mkdir(exist_ok=True)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                cell = queue.pop(0)
                cmd = [sys.executable, "-m", "distill", *grid.run_args(cell)]
                starting(cell)
            log = grid.log(cell)
            with log.open("ab") as fh:
                code = subprocess.run(
                    cmd,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "DISTILL_WORKSPACE": str(grid.settings.workspace)},
                    preexec_fn=set_parent_death_signal,  # a killed grid leaves no cell running
                ).returncode
            with lock:
                if code == 0:
                    grid.spec.failed.pop(cell.label, None)
                    say(f"grid {cell.label}: done ({log})")
                else:
                    grid.spec.failed[cell.label] = f"exit {code}, see {log}"
                    say(f"grid {cell.label}: FAILED (exit {code}; {log})")
                grid.save()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(parallel, len(cells)))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        grid.spec.status = "KILLED"
        grid.save()
        raise
