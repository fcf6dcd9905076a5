"""`distill grid`, `distill grid status` and `distill compare --grid`: run or submit the cells,
follow them, print the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from distill.cli.common import console, fail

if TYPE_CHECKING:
    from distill.diagnose.grid_table import GridTable
    from distill.grid.folder import Grid
    from distill.grid.settings import SlurmSettings


def grid_command(
    domains: str,
    methods: str,
    seeds: int,
    overrides: list[str],
    skip: list[str],
    name: str | None,
    parallel: int,
    resume: str | None,
    argv: list[str],
    executor: str = "local",
    settings_file: Path | None = None,
    wait: bool = False,
) -> int:
    from distill.config import ConfigError
    from distill.grid.folder import Grid, create
    from distill.grid.local import run_cells
    from distill.grid.settings import is_setting, load_settings
    from distill.grid.spec import GridRefused, plan
    from distill.settings import get_settings

    settings = get_settings()
    grid = None
    if parallel < 1:
        raise fail(f"--parallel: {parallel}; give 1 or more")
    if executor not in ("local", "slurm"):
        raise fail(f"--executor: {executor!r}; give local or slurm")
    words = [o for o in overrides if is_setting(o)]
    overrides = [o for o in overrides if not is_setting(o)]
    try:
        if resume is not None:
            grid = Grid.find(settings, resume)
            if words or settings_file is not None:
                _resettle(grid, load_settings(settings_file, words).slurm, words, settings_file)
            typer.echo(f"grid {grid.spec.grid_id}: resuming ({len(grid.spec.cells())} cells)")
        else:
            if executor == "local" and (words or settings_file is not None):
                raise GridRefused(
                    f"{(words or ['--settings'])[0]}: the grid's SLURM settings; add --executor slurm"
                )
            slurm = load_settings(settings_file, words).slurm if executor == "slurm" else None
            spec = plan(domains, methods, seeds, overrides, skip, name, argv, slurm)
            if slurm is not None:
                from distill.grid.slurm import check

                check(spec, settings)  # before the grid folder or its MLflow run exists
            grid = create(settings, spec)
            typer.echo(f"grid {spec.grid_id}: {len(spec.cells())} cells in {grid.path}")
        for domain, budget in grid.spec.budgets.items():
            typer.echo(f"  budget {domain}: {budget.describe()}")
        if grid.spec.executor == "slurm":
            if parallel != 1:
                raise GridRefused(
                    "--parallel: the local executor's; on SLURM, slurm.max_running cells run at once"
                )
            return _on_slurm(grid, resume is not None, wait)
        if wait:
            raise GridRefused("--wait: the local executor always waits; it goes with --executor slurm")
        run_cells(grid, parallel, typer.echo)
    except (GridRefused, ConfigError) as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        if grid is None:
            raise fail("interrupted before the grid started; nothing was written", 130) from None
        if grid.spec.executor == "slurm":
            raise fail(
                f"stopped waiting; the jobs go on (`distill grid status {grid.spec.grid_id}`)", 130
            ) from None
        report(grid, final=True)
        raise fail(f"interrupted; continue with `distill grid --resume {grid.spec.grid_id}`", 130) from None
    report(grid, final=True)
    return 1 if grid.spec.failed else 0


def _resettle(grid: Grid, slurm: SlurmSettings, words: list[str], settings_file: Path | None) -> None:
    """`--resume` with new SLURM settings (a longer time limit, another partition): they apply to
    the jobs it submits."""
    from distill.grid.slurm import check
    from distill.grid.spec import GridRefused
    from distill.settings import get_settings

    if grid.spec.executor != "slurm":
        raise GridRefused(f"{(words or ['--settings'])[0]}: grid {grid.spec.grid_id} runs on this machine")
    if settings_file is None:  # words alone change the saved settings, field by field
        from distill.grid.settings import load_settings

        saved = grid.spec.slurm.model_dump(mode="json", exclude_defaults=True) if grid.spec.slurm else {}
        slurm = load_settings(None, [*(f"slurm.{k}={_yaml(v)}" for k, v in saved.items()), *words]).slurm
    grid.spec.slurm = slurm
    check(grid.spec, get_settings())
    grid.save()


def _yaml(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON is YAML: lists and strings come back as they were


def _on_slurm(grid: Grid, resuming: bool, wait: bool) -> int:
    """Submit (or resubmit) the cells; with `wait`, follow them and print the table at the end."""
    from distill.grid.slurm import submit_cells
    from distill.grid.status import conclude
    from distill.grid.status import wait as wait_for

    submit_cells(grid, resuming, typer.echo)
    if not wait:
        typer.echo(
            f"submitted; follow with `distill grid status {grid.spec.grid_id}` "
            f"(--wait waits), resubmit what died with `distill grid --resume {grid.spec.grid_id}`"
        )
        return 0
    rows = wait_for(grid, typer.echo)
    conclude(grid, rows)
    report(grid, final=True)
    if grid.spec.failed:
        typer.echo(f"not every cell finished; `distill grid --resume {grid.spec.grid_id}` resubmits them")
    return 1 if grid.spec.failed else 0


def status_command(ref: str, wait: bool) -> int:
    """`distill grid status <grid>`: each cell's SLURM job and run; the table once all are done."""
    from rich.table import Table

    from distill.grid.folder import Grid
    from distill.grid.spec import GridRefused
    from distill.grid.status import cell_rows, conclude
    from distill.grid.status import wait as wait_for
    from distill.settings import get_settings

    try:
        grid = Grid.find(get_settings(), ref)
    except GridRefused as exc:
        raise fail(str(exc)) from None
    rows = wait_for(grid, typer.echo) if wait else cell_rows(grid)
    # The first look after a SLURM grid's last job ended closes its parent run (a local grid's
    # own process does that).
    ended = grid.spec.executor == "slurm" and conclude(grid, rows)
    table = Table(title=f"grid {grid.spec.grid_id} ({grid.spec.executor}): {grid.spec.status}")
    for column in ("cell", "job", "SLURM state", "run", "step"):
        table.add_column(column, justify="right" if column == "step" else "left")
    for row in rows:
        table.add_row(row.cell.label, row.job_id, row.job_state, row.run_status, f"{row.step}/{row.steps}")
    console().print(table)
    if any(row.active for row in rows):
        return 0
    report(grid, final=ended)
    return 1 if grid.spec.failed else 0


def report(grid: Grid, final: bool = False) -> GridTable:
    """Build, write (table.md, table.csv, grid.png in the grid folder) and print the table; with
    `final` also log them to the grid's MLflow run and end it with the grid's status."""
    from distill.diagnose.grid_table import build, mlflow_metrics, plot, to_csv, to_markdown
    from distill.grid.folder import finish

    cells = grid.summaries()
    table = build(grid.spec.domains, grid.spec.methods, list(cells.items()))
    table.budgets = {d: b.describe() for d, b in grid.spec.budgets.items()}
    files = [grid.path / "table.md", grid.path / "table.csv"]
    files[0].write_text(to_markdown(table))
    files[1].write_text(to_csv(table))
    files.append(plot(table, grid.path / "grid.png"))
    if final:
        finish(grid, [*files, grid.path / "grid.json"], mlflow_metrics(table))
    print_table(grid, table, files)
    return table


def print_table(grid: Grid, table: GridTable, files: list[Path]) -> None:
    from rich.table import Table

    from distill.diagnose.grid_table import header, student_notes

    out = console()
    spec = grid.spec
    seeds = f"{spec.seeds} seed{'s' if spec.seeds > 1 else ''}"
    rich_table = Table(
        title=f"grid {spec.grid_id}: mean ± std over {seeds}; (+x) lift over the student before"
    )
    rich_table.add_column("method")
    for d, k in table.keys():
        rich_table.add_column(f"{d}\n{header(k)}", justify="right")
    for row in table.rows():
        cells = [f"[bold]{text}[/bold]" if best else text for text, best in table.entries(row)]
        rich_table.add_row(row, *cells, style="dim" if row not in table.methods else None)
    out.print(rich_table)
    for line in student_notes(table):
        out.print(f"  {line}")
    for d, budget in table.budgets.items():
        out.print(f"  budget {d}: {budget}")
    out.print("diagnose per cell:")
    for cell in spec.cells():
        status, counts, findings = table.cells.get(cell.label, ("NEW", {}, []))
        tally = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing above info"
        names = f": {', '.join(findings)}" if findings else ""
        failed = f"  ({spec.failed[cell.label]})" if cell.label in spec.failed else ""
        out.print(f"  {cell.label:<24} {status:<9} {tally}{names}{failed}")
    for path in files:
        out.print(f"  {path.name:<10} {path}")
    if spec.mlflow_run_id:
        out.print(f"  mlflow     parent run {spec.mlflow_run_id} ({spec.experiment})")


def compare_grid(ref: str) -> int:
    """`distill compare --grid <id>`: the table again, from the cells' run folders."""
    from distill.grid.folder import Grid
    from distill.grid.spec import GridRefused
    from distill.settings import get_settings

    try:
        grid = Grid.find(get_settings(), ref)
    except GridRefused as exc:
        raise fail(str(exc)) from None
    report(grid)
    return 0
