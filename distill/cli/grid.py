"""`distill grid` and `distill compare --grid`: run the cells, then print the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from distill.cli.common import console, fail

if TYPE_CHECKING:
    from distill.diagnose.grid_table import GridTable
    from distill.grid import Grid


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
) -> int:
    from distill.grid import Grid, GridRefused, create, plan, run_cells
    from distill.settings import get_settings

    settings = get_settings()
    grid = None
    if parallel < 1:
        raise fail(f"--parallel: {parallel}; give 1 or more")
    try:
        if resume is not None:
            grid = Grid.find(settings, resume)
            typer.echo(f"grid {grid.spec.grid_id}: resuming ({len(grid.spec.cells())} cells)")
        else:
            spec = plan(domains, methods, seeds, overrides, skip, name, argv)
            grid = create(settings, spec)
            typer.echo(f"grid {spec.grid_id}: {len(spec.cells())} cells in {grid.path}")
        for domain, budget in grid.spec.budgets.items():
            typer.echo(f"  budget {domain}: {budget.describe()}")
        run_cells(grid, parallel, typer.echo)
    except GridRefused as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        if grid is None:
            raise fail("interrupted before the grid started; nothing was written", 130) from None
        report(grid, final=True)
        raise fail(f"interrupted; continue with `distill grid --resume {grid.spec.grid_id}`", 130) from None
    report(grid, final=True)
    return 1 if grid.spec.failed else 0


def report(grid: Grid, final: bool = False) -> GridTable:
    """Build, write (table.md, table.csv, grid.png in the grid folder) and print the table; with
    `final` also log them to the grid's MLflow run and end it with the grid's status."""
    from distill.diagnose.grid_table import build, mlflow_metrics, plot, to_csv, to_markdown
    from distill.grid import finish

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
    from distill.grid import Grid, GridRefused
    from distill.settings import get_settings

    try:
        grid = Grid.find(get_settings(), ref)
    except GridRefused as exc:
        raise fail(str(exc)) from None
    report(grid)
    return 0
