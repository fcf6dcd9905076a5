"""A diagnosis as the terminal, Markdown and JSON see it, and the files it leaves in the run.

`<run>/diagnose/` gets report.json, report.md and the plots; that folder is what goes to MLflow.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.diagnose.findings import Finding, Severity, crashed, exit_code
from distill.diagnose.records import RunRecord

STYLE = {
    Severity.ERROR: "bold white on red",
    Severity.WARNING: "bold black on yellow",
    Severity.INFO: "bold white on blue",
}


@dataclass
class Report:
    record: RunRecord
    findings: list[Finding]
    plots: list[Path] = field(default_factory=list)
    # Where the diagnose folder went in MLflow, or why it did not.
    mlflow: str = ""
    # Why <run>/diagnose/ could not be written (a read-only run dir); the findings still stand.
    write_error: str = ""

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)

    def counts(self) -> dict[str, int]:
        out = {s.label: 0 for s in sorted(Severity, reverse=True)}
        for f in self.findings:
            out[f.severity.label] += 1
        return out

    def header(self) -> dict[str, Any]:
        rec = self.record
        return {
            "run_id": rec.name,
            "run_dir": str(rec.run_dir),
            "domain": rec.domain,
            "method": rec.method,
            "student": rec.cfg("student.name") or rec.summary.get("student"),
            "teacher": rec.teacher,
            "status": rec.summary.get("status", "?"),
            "steps": rec.train_steps(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.header(),
            "exit_code": self.exit_code,
            "counts": self.counts(),
            # Rules that crashed: their checks were not made (exit code 3).
            "incomplete": crashed(self.findings),
            "findings": [f.to_dict() for f in self.findings],
            "plots": [str(p) for p in self.plots],
            "mlflow": self.mlflow,
            "write_error": self.write_error,
        }


def _count_line(report: Report) -> str:
    parts = [
        f"{n} {label}{'s' if n != 1 and label != 'info' else ''}" for label, n in report.counts().items() if n
    ]
    line = ", ".join(parts) or "no findings"
    rules = crashed(report.findings)
    if rules:
        line += f"; incomplete: {', '.join(rules)} crashed"
    return line


def to_markdown(report: Report) -> str:
    h = report.header()
    lines = [
        f"# diagnose: {h['run_id']}",
        "",
        f"{h['domain']} · {h['method']} · {h['steps']} steps · {h['status']} — student `{h['student']}` "
        f"<- teacher `{h['teacher']}`",
        "",
        f"**{_count_line(report)}** (exit code {report.exit_code})",
    ]
    for f in report.findings:
        lines += ["", f"## {f.severity.label.upper()}: {f.title}", "", f"`{f.name}`", "", "**Evidence**", ""]
        lines += [f"- {e.text()}" for e in f.evidence]
        lines += ["", f"**Why it matters.** {f.why}"]
        if f.fixes or f.advice:
            lines += ["", "**Fix**", ""]
            lines += [f"- `{x.override}`" + (f" — {x.reason}" if x.reason else "") for x in f.fixes]
            if f.advice:
                lines.append(f"- {f.advice}")
    if report.plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in report.plots]
    return "\n".join(lines) + "\n"


def to_json(reports: list[Report]) -> str:
    return json.dumps(
        {"exit_code": max((r.exit_code for r in reports), default=0), "runs": [r.to_dict() for r in reports]},
        indent=2,
        default=str,
    )


def _emit(console: Any, renderable: Any) -> None:
    """Print; off a terminal without the pad spaces rich puts after every table cell (logs, CI)."""
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def print_report(report: Report, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    h = report.header()
    console.print()
    console.print(
        f"[bold]diagnose {escape(h['run_id'])}[/bold]  {h['domain']} · {h['method']} · "
        f"{h['steps']} steps · {h['status']}"
    )
    console.print(
        f"  student {escape(str(h['student']))}  <-  teacher {escape(str(h['teacher']))}", style="dim"
    )
    console.print(f"  {_count_line(report)}")
    for f in report.findings:
        console.print()
        console.print(
            f"[{STYLE[f.severity]}] {f.severity.label.upper()} [/] [bold]{escape(f.title)}[/bold]"
            f"  [dim]({escape(f.name)})[/dim]"
        )
        # A two-column grid gives wrapped lines a hanging indent under their label.
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=9, style="dim")
        grid.add_column(overflow="fold")
        for i, e in enumerate(f.evidence):
            grid.add_row("  numbers" if i == 0 else "", escape(e.text()))
        grid.add_row("  why", escape(f.why))
        for i, x in enumerate(f.fixes):
            reason = f"  [dim]{escape(x.reason)}[/dim]" if x.reason else ""
            grid.add_row("  fix" if i == 0 else "", f"[bold green]{escape(x.override)}[/bold green]{reason}")
        if f.advice:
            grid.add_row("" if f.fixes else "  fix", escape(f.advice))
        _emit(console, grid)
    if report.plots:
        console.print()
        console.print(
            f"  plots   {escape(str(report.plots[0].parent))}/ ({', '.join(p.name for p in report.plots)})"
        )
    if report.write_error:
        console.print(f"  [yellow]not written[/yellow] {escape(report.write_error)}")


def write_files(report: Report, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
    (folder / "report.md").write_text(to_markdown(report))
    return [folder / "report.json", folder / "report.md"]


def build_report(rec: RunRecord, plots: bool = True) -> Report:
    """Findings for a run, with its report files (and plots) written under `<run>/diagnose/`."""
    from distill.diagnose import diagnose

    report = Report(rec, diagnose(rec))
    folder = rec.run_dir / "diagnose"
    try:
        if plots:
            from distill.diagnose.plots import plot_run

            report.plots = plot_run(rec, folder)
        write_files(report, folder)
    except OSError as exc:  # a read-only run dir still gets its findings printed
        report.write_error = f"{exc.strerror or exc}: {exc.filename or folder}"
    return report


def log_to_mlflow(report: Report) -> str:
    """The diagnose folder as artifacts `diagnose/` of the run's MLflow run.

    Logged on the existing run id (`tracking.mlflow.log_artifacts_to`): re-opening the run through
    the tracker would set it RUNNING and then change how it ended.
    """
    summary = report.record.summary
    run_id, uri = summary.get("mlflow_run_id"), summary.get("tracking_uri")
    folder = report.record.run_dir / "diagnose"
    if not run_id or not uri:
        return "not logged: summary.json has no mlflow_run_id"
    if not folder.is_dir():
        return "not logged: nothing written"
    # A tracking server that is down must cost seconds, not MLflow's default minutes of retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    try:
        from distill.tracking.mlflow import log_artifacts_to

        log_artifacts_to(uri, run_id, folder, "diagnose")
    except Exception as exc:  # the diagnosis stands without MLflow; say why it is not there
        return f"not logged: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"run {run_id}: artifacts diagnose/ ({uri})"
