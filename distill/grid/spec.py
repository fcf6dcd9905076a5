"""A grid's plan: its cells, each domain's matched budget, every cell's config checked.

Matched budget: every method of a domain runs the same optimiser steps, the same prompts per step
and samples per prompt (SFT: the same sequences per step, `optim.batch_size`) and the same eval
items. The budget is the domain's OPD preset after the grid's overrides; the cells are checked
against it before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from distill import registry
from distill.config import ConfigError, resolve_config
from distill.engines.compat import check_config
from distill.grid.settings import Executor, SlurmSettings
from distill.tracking.rundir import RunRefused, check_run_id

if TYPE_CHECKING:
    from distill.config import RunConfig

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
    # Where the cells run: processes here, or SLURM jobs (`slurm`: their settings, `jobs`: each
    # cell's job ids, the last one its current job).
    executor: Executor = "local"
    slurm: SlurmSettings | None = None
    jobs: dict[str, list[str]] = {}

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
    slurm: SlurmSettings | None = None,
) -> GridSpec:
    """The grid, every cell's config checked; nothing is written. GridRefused names the
    option, override or cell that is wrong. With `slurm` its cells are SLURM jobs."""
    if seeds < 1:
        raise GridRefused(f"--seeds: {seeds}; give 1 or more")
    for method in _split(methods, "method"):
        if method not in registry.METHODS:
            raise GridRefused(f"--method: unknown method {method!r}; known: {', '.join(registry.METHODS)}")
    spec = GridSpec(
        grid_id=grid_id or new_grid_id(),
        domains=_split(domains, "domain"),
        methods=_split(methods, "method"),
        seeds=seeds,
        overrides=overrides,
        skip=skip,
        argv=argv,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        executor="slurm" if slurm is not None else "local",
        slurm=slurm,
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
            check_config(cell_config(spec, cell))
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


def cell_config(spec: GridSpec, cell: Cell) -> RunConfig:
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
