"""A grid's folder (`<workspace>/grids/<grid_id>/grid.json`) and its parent MLflow run.

The grid's state is its cells' run folders (plus, on SLURM, each cell's job ids in grid.json):
whatever ran a cell, `status` and `--resume` read the same truth.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.config import dump_config
from distill.grid.spec import Cell, GridRefused, GridSpec, cell_config
from distill.tracking.mlflow import MlflowTracker, mlflow_metric_name, open_tracker
from distill.tracking.rundir import RunDir, live_status

if TYPE_CHECKING:
    from distill.settings import Settings

GRID_FILE = "grid.json"


def grids_dir(settings: Settings) -> Path:
    return settings.workspace / "grids"


class Grid:
    """A grid folder: grid.json and the cells' state (their run folders)."""

    def __init__(self, settings: Settings, spec: GridSpec) -> None:
        self.settings = settings
        self.spec = spec
        self.path = grids_dir(settings) / spec.grid_id

    @classmethod
    def find(cls, settings: Settings, ref: str) -> Grid:
        path = Path(ref) if (Path(ref) / GRID_FILE).exists() else grids_dir(settings) / ref
        if not (path / GRID_FILE).exists():
            raise GridRefused(
                f"no grid {ref!r}: not a grid folder, nor a grid id under {grids_dir(settings)}"
            )
        try:
            spec = GridSpec.model_validate_json((path / GRID_FILE).read_text())
        except ValueError as exc:
            raise GridRefused(f"{path / GRID_FILE}: unreadable ({type(exc).__name__})") from None
        grid = cls(settings, spec)
        grid.path = path
        return grid

    def save(self) -> None:
        tmp = self.path / f"{GRID_FILE}.tmp"
        tmp.write_text(self.spec.model_dump_json(indent=2))
        os.replace(tmp, self.path / GRID_FILE)

    def run_dir(self, cell: Cell) -> Path:
        return self.settings.runs_dir / self.spec.run_id(cell)

    def log(self, cell: Cell) -> Path:
        """The output of the cell's processes (`--parallel`, SLURM jobs)."""
        return self.path / "logs" / f"{self.spec.run_id(cell)}.log"

    def cell_status(self, cell: Cell) -> str:
        """NEW (no run yet), or the run's live status (FINISHED, DIED, KILLED, FAILED, RUNNING)."""
        run = RunDir(self.run_dir(cell))
        if not run.config.exists():
            return "NEW"
        return live_status(run.read_summary()) if run.summary.exists() else "DIED"

    def last_step(self, cell: Cell) -> int:
        """The last training step the cell's metrics.jsonl holds (0 before its first)."""
        run = RunDir(self.run_dir(cell))
        if not run.metrics.exists():
            return 0
        return max((int(r["step"]) for r in run.metric_rows() if "train/loss" in r), default=0)

    def run_args(self, cell: Cell) -> list[str]:
        """`distill run`'s arguments for the cell: its config file (written here, in the grid
        folder) when it never started, else `--resume` from its last checkpoint."""
        if self.cell_status(cell) != "NEW":
            return ["run", "--resume", self.spec.run_id(cell)]
        path = self.path / "cells" / f"{self.spec.run_id(cell)}.yaml"
        path.parent.mkdir(exist_ok=True)
        dump_config(cell_config(self.spec, cell), path)
        return ["run", "--config", str(path)]

    def summaries(self) -> dict[Cell, dict[str, Any]]:
        out = {}
        for cell in self.spec.cells():
            run = RunDir(self.run_dir(cell))
            if run.summary.exists():
                out[cell] = run.read_summary()
        return out


def create(settings: Settings, spec: GridSpec) -> Grid:
    """The grid folder and its parent MLflow run."""
    grid = Grid(settings, spec)
    if grid.path.exists():
        raise GridRefused(f"grid folder {grid.path} already exists; pick another --name or --resume it")
    spec.tracking_uri = settings.resolved_tracking_uri
    tracker = open_tracker(
        spec.tracking_uri,
        spec.experiment,
        settings.artifact_root,
        run_name=spec.grid_id,
        tags={
            "distill.grid": spec.grid_id,
            "distill.executor": spec.executor,
            "domain": ",".join(spec.domains),
            "method": ",".join(spec.methods),
        },
    )
    params: dict[str, Any] = {"grid.seeds": spec.seeds, "grid.overrides": " ".join(spec.overrides) or "-"}
    params.update({f"grid.budget.{d}": b.describe() for d, b in spec.budgets.items()})
    tracker.log_params(params)
    tracker.flush()
    spec.mlflow_run_id = tracker.run_id
    grid.path.mkdir(parents=True)
    grid.save()
    return grid


def finish(grid: Grid, artifacts: list[Path], metrics: dict[str, float]) -> None:
    """The parent MLflow run: the table's files and numbers, and the grid's end status."""
    tracker = MlflowTracker.attach(grid.spec.tracking_uri, str(grid.spec.mlflow_run_id))
    tracker.log_metrics({mlflow_metric_name(k): v for k, v in metrics.items()}, step=0)
    for path in artifacts:
        tracker.log_artifact(path)
    tracker.finish(grid.spec.status if grid.spec.status in ("FINISHED", "FAILED", "KILLED") else "FINISHED")
