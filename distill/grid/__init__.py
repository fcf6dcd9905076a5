"""`distill grid`: domains x methods x seeds as ordinary runs, matched budgets, one parent MLflow run.

A grid lives in `<workspace>/grids/<grid_id>/grid.json`: what was asked (domains, methods, seeds,
overrides), the budget each domain's cells share, the parent MLflow run, the cells and, on SLURM,
each cell's job ids. A cell is an ordinary run (`<workspace>/runs/<grid_id>-<domain>-<method>-s<seed>`)
whose MLflow run is a child of the grid's. Its state is its run folder, so `--resume` keeps FINISHED
cells, continues a cell that died from its last checkpoint, and starts the ones that never began:
no cell twice.

- `spec`: the plan: the cells, each domain's budget, every cell's config checked before anything is written;
- `folder`: grid.json and the parent MLflow run;
- `local`: the cells as processes on this machine (the default executor);
- `slurm`, `cell_job`: each cell a SLURM job through submitit, requeued at its time limit;
- `status`: SLURM's job states beside the runs', what `--resume` resubmits, `--wait`;
- `settings`: the grid's own settings (the `slurm:` section).
"""

from __future__ import annotations

import importlib
from typing import Any

# Names -> their module, imported on first use: a cell's SLURM job imports `distill.grid.cell_job`
# (and so this package) without the trainer's stack the local executor brings.
_EXPORTS = {
    "GRID_FILE": "folder",
    "Grid": "folder",
    "create": "folder",
    "finish": "folder",
    "grids_dir": "folder",
    "run_cells": "local",
    "Budget": "spec",
    "Cell": "spec",
    "GridRefused": "spec",
    "GridSpec": "spec",
    "cell_config": "spec",
    "plan": "spec",
    "GridSettings": "settings",
    "SlurmSettings": "settings",
    "load_settings": "settings",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'distill.grid' has no attribute {name!r}")
    return getattr(importlib.import_module(f"distill.grid.{_EXPORTS[name]}"), name)
