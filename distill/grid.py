"""`distill grid`: domains x methods x seeds as ordinary runs, matched budgets, one parent MLflow run.

A grid lives in `<workspace>/grids/<grid_id>/grid.json`: what was asked (domains, methods, seeds,
overrides), the budget each domain's cells share, the parent MLflow run and the cells. A cell is an
ordinary run (`<workspace>/runs/<grid_id>-<domain>-<method>-s<seed>`) whose MLflow run is a child
of the grid's. Its state is its run folder, so `--resume` keeps FINISHED cells, continues a cell
that died from its last checkpoint, and starts the ones that never began: no cell twice.

Matched budget: every method of a domain runs the same optimiser steps, the same prompts per step
and samples per prompt (SFT: the same sequences per step, `optim.batch_size`) and the same eval
items. The budget is the domain's OPD preset after the grid's overrides; the cells are checked
against it before anything is written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from distill import registry
from distill.config import ConfigError, dump_config, resolve_config
from distill.engines.compat import check_config
from distill.launch import set_parent_death_signal
from distill.runner import execute
from distill.tracking.mlflow import MlflowTracker, client_for, mlflow_metric_name, open_tracker
from distill.tracking.rundir import RunDir, RunRefused, check_run_id, live_status

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.settings import Settings

Say = Callable[[str], None]
GRID_FILE = "grid.json"
# A domain's budget is its preset of this method (after the grid's overrides).
BUDGET_METHOD = "opd"


class Budget(BaseModel):
    """What every method of one domain gets."""

    model_config = ConfigDict(extra="forbid")
    steps: int
    prompts_per_step: int
    samples_per_prompt: int
    eval_items: int

    def overrides(self, method: str) -> list[str]:
        out = [f"optim.max_steps={self.steps}", f"eval.items={self.eval_items}"]
        if not registry.method_entry(method).student_samples:  # no rollouts: the same sequences per step
            return [*out, f"optim.batch_size={self.prompts_per_step * self.samples_per_prompt}"]
        return [
            *out,
            f"rollout.prompts_per_step={self.prompts_per_step}",
            f"rollout.num_generations={self.samples_per_prompt}",
        ]

    def of(self, config: RunConfig) -> Budget:
        """The budget `config` actually has (to check a cell against its domain's)."""
        sft = not registry.method_entry(config.method.name).student_samples
        return Budget(
            steps=config.optim.max_steps,
            prompts_per_step=config.optim.batch_size // self.samples_per_prompt
            if sft
            else config.rollout.prompts_per_step,
            samples_per_prompt=self.samples_per_prompt if sft else config.rollout.num_generations,
            eval_items=config.eval.items,
        )

    def describe(self) -> str:
        return (
            f"{self.steps} steps x {self.prompts_per_step} prompts x {self.samples_per_prompt} samples "
            f"(sft: {self.prompts_per_step * self.samples_per_prompt} teacher sequences per step), "
            f"{self.eval_items} eval items"
        )


class GridSpec(BaseModel):
    """grid.json: what was asked, what each domain's cells share, where it is tracked."""

    model_config = ConfigDict(extra="forbid")
    grid_id: str
    domains: list[str]
    methods: list[str]
    seeds: int = Field(1, ge=1)
    overrides: list[str] = []
    skip: list[str] = []
    budgets: dict[str, Budget] = {}
    argv: list[str] = []
    created: str = ""
    status: str = "RUNNING"
    mlflow_run_id: str | None = None
    tracking_uri: str = ""
    experiment: str = "distill"
    failed: dict[str, str] = {}

    def cells(self) -> list[Cell]:
        return [
            Cell(d, m, s)
            for d in self.domains
            for m in self.methods
            for s in range(self.seeds)
            if f"{d}/{m}" not in self.skip
        ]

    def run_id(self, cell: Cell) -> str:
        return f"{self.grid_id}-{cell.domain}-{cell.method}-s{cell.seed}"


@dataclass(frozen=True)
class Cell:
    domain: str
    method: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.domain}/{self.method}/s{self.seed}"

    @property
    def scopes(self) -> tuple[str, str, str]:
        """What a scoped override may name to reach this cell."""
        return self.domain, self.method, f"{self.domain}/{self.method}"


def _scope(text: str) -> tuple[str | None, str]:
    """`sft:method.temperature=0.7` -> ("sft", "method.temperature=0.7"): an override for the
    cells of one method, domain or `domain/method` only (a method's own fields differ)."""
    head, sep, rest = text.partition(":")
    if sep and "=" in rest and "=" not in head and "." not in head:
        return head, rest
    return None, text


class GridRefused(ValueError):
    """A grid that cannot start or continue as asked: one line, raised before anything is written."""


def grids_dir(settings: Settings) -> Path:
    return settings.workspace / "grids"


def new_grid_id() -> str:
    return "grid-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def _split(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise GridRefused(f"--{what}: give at least one, comma-separated")
    if len(set(items)) != len(items):
        raise GridRefused(f"--{what}: {text!r} names one twice")
    return items


def plan(
    domains: str,
    methods: str,
    seeds: int,
    overrides: list[str],
    skip: list[str],
    grid_id: str | None,
    argv: list[str],
) -> GridSpec:
    """The grid, every cell's config checked; nothing is written. GridRefused names the
    option, override or cell that is wrong."""
    if seeds < 1:
        raise GridRefused(f"--seeds: {seeds}; give 1 or more")
    spec = GridSpec(
        grid_id=grid_id or new_grid_id(),
        domains=_split(domains, "domain"),
        methods=_split(methods, "method"),
        seeds=seeds,
        overrides=overrides,
        skip=skip,
        argv=argv,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    for pair in skip:
        d, _, m = pair.partition("/")
        if d not in spec.domains or m not in spec.methods:
            raise GridRefused(f"--skip {pair!r}: not a domain/method cell of this grid")
    scopes = {s for c in spec.cells() for s in c.scopes}
    for text in overrides:
        scope, field = _scope(text)
        if scope is not None and scope not in scopes:
            raise GridRefused(
                f"override {text!r}: {scope!r} is no method, domain or domain/method of this grid"
            )
        if field.split("=", 1)[0] in ("seed", "tracking.run_name", "tracking.parent_run_id", "domain.name"):
            raise GridRefused(f"override {text!r}: the grid sets it for each cell")
    try:
        check_run_id(spec.run_id(Cell(spec.domains[0], spec.methods[0], 0)), "--name")
        for domain in spec.domains:
            shared = [t for scope, t in map(_scope, overrides) if scope in (None, domain)]
            ref = _resolve(domain, BUDGET_METHOD, shared)
            spec.budgets[domain] = Budget(
                steps=ref.optim.max_steps,
                prompts_per_step=ref.rollout.prompts_per_step,
                samples_per_prompt=ref.rollout.num_generations,
                eval_items=ref.eval.items,
            )
        spec.experiment = ref.tracking.experiment
        for cell in spec.cells():
            check_config(_cell_config(spec, cell))
    except (ConfigError, RunRefused) as exc:
        raise GridRefused(str(exc)) from None
    return spec


def _resolve(domain: str, method: str, overrides: list[str]) -> RunConfig:
    try:
        return resolve_config(domain, method, overrides=overrides)
    except ConfigError as exc:
        hint = ""
        if "method." in str(exc) and "Extra inputs" in str(exc):
            hint = f" (a field of one method only: scope it, e.g. `{method}:method.<field>=...`)"
        elif registry.MIX in domain and not registry.method_entry(method).multi_domain:
            hint = f" (leave the cell out: --skip {domain}/{method})"
        raise ConfigError(f"{domain}/{method}: {exc}{hint}") from None


def _cell_config(spec: GridSpec, cell: Cell) -> RunConfig:
    budget = spec.budgets[cell.domain]
    mine = [text for scope, text in map(_scope, spec.overrides) if scope in (None, *cell.scopes)]
    cell_fields = [f"seed={cell.seed}", f"tracking.run_name={spec.run_id(cell)}"]
    if spec.mlflow_run_id:  # once the grid exists: the cell's MLflow run is a child of the grid's
        cell_fields.append(f"tracking.parent_run_id={spec.mlflow_run_id}")
    config = _resolve(cell.domain, cell.method, [*budget.overrides(cell.method), *mine, *cell_fields])
    actual = budget.of(config)
    if actual != budget:
        raise ConfigError(
            f"{cell.domain}/{cell.method}: budget {actual.describe()} differs from the domain's "
            f"{budget.describe()}; a budget is the whole domain's: set it unscoped or `{cell.domain}:`-scoped"
        )
    return config


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

    def cell_status(self, cell: Cell) -> str:
        """NEW (no run yet), or the run's live status (FINISHED, DIED, KILLED, FAILED, RUNNING)."""
        run = RunDir(self.run_dir(cell))
        if not run.config.exists():
            return "NEW"
        return live_status(run.read_summary()) if run.summary.exists() else "DIED"

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
    config = _cell_config(grid.spec, cell) if grid.cell_status(cell) == "NEW" else None
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


def _cell_command(grid: Grid, cell: Cell) -> list[str]:
    if grid.cell_status(cell) != "NEW":
        return [sys.executable, "-m", "distill", "run", "--resume", grid.spec.run_id(cell)]
    config = _cell_config(grid.spec, cell)
    path = grid.path / "cells" / f"{grid.spec.run_id(cell)}.yaml"
    path.parent.mkdir(exist_ok=True)
    dump_config(config, path)
    return [sys.executable, "-m", "distill", "run", "--config", str(path)]


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
                cmd = _cell_command(grid, cell)
                starting(cell)
            log = grid.path / "logs" / f"{grid.spec.run_id(cell)}.log"
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


def finish(grid: Grid, artifacts: list[Path], metrics: dict[str, float]) -> None:
    """The parent MLflow run: the table's files and numbers, and the grid's end status."""
    tracker = MlflowTracker.attach(grid.spec.tracking_uri, str(grid.spec.mlflow_run_id))
    tracker.log_metrics({mlflow_metric_name(k): v for k, v in metrics.items()}, step=0)
    for path in artifacts:
        tracker.log_artifact(path)
    tracker.finish(grid.spec.status if grid.spec.status in ("FINISHED", "FAILED", "KILLED") else "FINISHED")
