"""`distill diagnose` and `distill compare`: load runs, apply the library, print, set the exit code.

Every run reference is resolved before any work starts, so a typo fails in a second with one
`error:` line (exit 2) instead of after the other runs were diagnosed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from distill.cli.common import console

if TYPE_CHECKING:
    from distill.diagnose.records import RunRecord

FORMATS = ("text", "json", "markdown")
COMPARE_FORMATS = ("table", "markdown", "csv", "json")


def _load_all(refs: list[str]) -> list[RunRecord]:
    from distill.diagnose.records import load_run

    records = []
    for ref in dict.fromkeys(refs):  # the same run named twice is diagnosed once
        records.append(load_run(ref))
    return records


def diagnose_command(refs: list[str], fmt: str, plots: bool, mlflow: bool) -> int:
    """Diagnose runs; returns the exit code (0 info only, 1 warnings, 2 errors, 3 a rule crashed).

    Raises ValueError (RunNotReadable) for a run that cannot be found or read.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    from distill.diagnose.report import build_report, log_to_mlflow, print_report, to_json, to_markdown

    reports = [build_report(rec, plots=plots) for rec in _load_all(refs)]
    # Findings first: MLflow costs seconds to import, the reader should not wait for it.
    if fmt == "text":
        out = console()
        for report in reports:
            print_report(report, out)
    elif fmt == "markdown":
        print("\n".join(to_markdown(r) for r in reports), end="")
    if mlflow:
        for report in reports:
            if report.record.summary.get("mlflow_run_id"):
                report.mlflow = log_to_mlflow(report)
                if fmt == "text":
                    console().print(f"  mlflow  {report.record.name}: {report.mlflow}")
    if fmt == "json":
        print(to_json(reports))
    return max(r.exit_code for r in reports)


def default_plot_path() -> Path:
    from distill.settings import get_settings

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return get_settings().workspace / "compare" / f"compare-{stamp}.png"


def compare_command(refs: list[str], baseline: str | None, fmt: str, plot: Path | None, no_plot: bool) -> int:
    if fmt not in COMPARE_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(COMPARE_FORMATS)}")
    from distill.diagnose.compare import build_table, plot_curves, print_table, to_csv, to_json, to_markdown
    from distill.diagnose.records import load_run

    records = _load_all(refs)
    base_id = None
    if baseline is not None:
        base = load_run(baseline)
        base_id = base.name
        if base_id not in {r.name for r in records}:
            records.insert(0, base)  # the baseline is a row of the table, named or not
    table = build_table(records, base_id)
    path = None if no_plot else plot_curves(table, plot or default_plot_path())
    if fmt == "table":
        out = console()
        print_table(table, out)
        if path is not None:
            out.print(f"plot  {path}")
    elif fmt == "markdown":
        print(to_markdown(table), end="")
    elif fmt == "csv":
        print(to_csv(table), end="")
    else:
        print(to_json(table, path))
    return 0
