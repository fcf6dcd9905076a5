"""`distill compare`: the results table of the reference documents, one row per run.

Columns are whatever final eval metrics the runs have (avg@k, pass@k, solved; SciWorld's Score,
Success, Pass(>0) when logged), the best value per column is marked, and every value carries its
delta against a baseline row. Higher is better in every column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.diagnose.findings import fmt
from distill.diagnose.records import RunRecord, Series

# metric key in summary.json / eval files -> column header (SciWorld's names from the reference).
NAMED = {"score": "Score", "success": "Success", "pass_gt0": "Pass(>0)"}


@dataclass
class Row:
    run_id: str
    domain: str
    method: str
    student: str
    teacher: str
    steps: int
    metrics: dict[str, float]
    curves: dict[str, Series] = field(default_factory=dict)


@dataclass
class Table:
    columns: list[str]
    rows: list[Row]
    baseline: str

    def value(self, row: Row, col: str) -> float | None:
        return row.metrics.get(col)

    def delta(self, row: Row, col: str) -> float | None:
        base = next(r for r in self.rows if r.run_id == self.baseline)
        a, b = row.metrics.get(col), base.metrics.get(col)
        return None if a is None or b is None else a - b

    def best(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for col in self.columns:
            values = [(r.metrics[col], r.run_id) for r in self.rows if r.metrics.get(col) is not None]
            if values:
                top = max(v for v, _ in values)
                out[col] = [rid for v, rid in values if math.isclose(v, top, rel_tol=1e-12, abs_tol=1e-12)]
        return out


def _short(name: Any) -> str:
    text = str(name or "")
    # Local model paths are long and only their last part tells runs apart; hub ids stay whole.
    return Path(text).name if text.startswith(("/", ".", "~")) else text


def _final_metrics(rec: RunRecord) -> dict[str, float]:
    after = rec.summary.get("student_after")
    if isinstance(after, dict) and after:
        return {k: float(v) for k, v in after.items() if isinstance(v, int | float)}
    # An unfinished run has no student_after: its last logged eval stands in.
    out: dict[str, float] = {}
    for bench in rec.benches():
        prefix = f"eval/{bench}/"
        for key in rec.series:
            s = rec.get(key) if key.startswith(prefix) else None
            if s is not None:
                out[key[len(prefix) :]] = s.last()
    return out


def row_for(rec: RunRecord) -> Row:
    curves = {}
    for bench in rec.benches():
        prefix = f"eval/{bench}/avg@"
        ks = sorted(
            (
                int(k[len(prefix) :])
                for k in rec.series
                if k.startswith(prefix) and k[len(prefix) :].isdigit()
            ),
            reverse=True,
        )
        # The curve of the largest k (avg@16 over avg@1), else SciWorld's score, else accuracy.
        for key in (*(f"{prefix}{k}" for k in ks), f"eval/{bench}/score", f"eval/{bench}/accuracy"):
            s = rec.get(key)
            if s is not None:
                curves[key] = s
                break
    return Row(
        run_id=rec.name,
        domain=rec.domain,
        method=_method_label(rec),
        student=_short(rec.cfg("student.name") or rec.summary.get("student")),
        teacher=_teacher(rec),
        steps=int(rec.summary.get("steps") or rec.train_steps()),
        metrics=_final_metrics(rec),
        curves=curves,
    )


def _teacher(rec: RunRecord) -> str:
    """The run's teacher; a teacher per domain as `rlve=<name>, dapo=<name>`."""
    teachers = rec.cfg("teachers") or {}
    if isinstance(teachers, dict) and teachers:
        return ", ".join(f"{d}={_short((t or {}).get('name'))}" for d, t in teachers.items())
    return _short(rec.cfg("teacher.name") or rec.summary.get("teacher"))


def part_rows(rec: RunRecord, whole: Row) -> list[Row]:
    """A run over several domains also gives a row per domain (`<run>[rlve]`): its final eval on
    that domain's items and that domain's teacher, to put beside one-domain runs."""
    out = []
    for part, scores in (rec.summary.get("parts") or {}).items():
        after = scores.get("student_after") if isinstance(scores, dict) else None
        curve = rec.get(f"eval/{part}/accuracy") or rec.get(f"eval/{part}/score")
        metrics = (
            {k: float(v) for k, v in after.items() if isinstance(v, int | float)}
            if isinstance(after, dict)
            else ({"accuracy": curve.last()} if curve is not None else {})
        )
        teacher = rec.cfg(f"teachers.{part}.name") or rec.cfg("teacher.name") or whole.teacher
        curves = {f"eval/{part}/accuracy": curve} if curve is not None else {}
        out.append(
            Row(
                f"{whole.run_id}[{part}]",
                part,
                whole.method,
                whole.student,
                _short(teacher),
                whole.steps,
                metrics,
                curves,
            )
        )
    return out


def _method_label(rec: RunRecord) -> str:
    """`opd` for the default loss, `opd/k3` for a member of the loss family (method.loss)."""
    loss = rec.cfg("method.loss")
    if loss and loss != "token_reward_direct":
        return f"{rec.method}/{loss}"
    return rec.method


def columns_for(rows: list[Row]) -> list[str]:
    keys = {k for r in rows for k in r.metrics}
    ks = sorted({int(k[4:]) for k in keys if k.startswith("avg@") and k[4:].isdigit()})
    cols: list[str] = []
    for k in ks:
        cols.append(f"avg@{k}")
        if k > 1 and f"pass@{k}" in keys:
            cols.append(f"pass@{k}")
    if any(k > 1 for k in ks) and "pass@1" in keys:
        cols.append("pass@1")
    if not cols and "accuracy" in keys:
        cols.append("accuracy")
    cols += [c for c in ("solved", *NAMED) if c in keys]
    return cols


def build_table(records: list[RunRecord], baseline: str | None = None) -> Table:
    rows = [r for rec in records for whole in [row_for(rec)] for r in (whole, *part_rows(rec, whole))]
    base = baseline if baseline is not None else rows[0].run_id
    if base not in {r.run_id for r in rows}:
        raise ValueError(f"baseline {base!r} is not among the compared runs")
    return Table(columns=columns_for(rows), rows=rows, baseline=base)


def header(col: str) -> str:
    return NAMED.get(col, col)


def _cell(table: Table, row: Row, col: str, best: dict[str, list[str]], bold: tuple[str, str]) -> str:
    v = table.value(row, col)
    if v is None:
        return "-"
    text = fmt(v) if col == "solved" else f"{v:.4f}"
    if row.run_id in best.get(col, []) and len(table.rows) > 1:
        text = f"{bold[0]}{text}{bold[1]}"
    d = table.delta(row, col)
    if row.run_id != table.baseline and d is not None:
        text += f" ({d:+.0f})" if col == "solved" else f" ({d:+.4f})"
    return text


FIXED = ("run", "domain", "method", "student", "teacher", "steps")


def _fixed(table: Table, row: Row) -> list[str]:
    name = row.run_id + (" (baseline)" if row.run_id == table.baseline else "")
    return [name, row.domain, row.method, row.student, row.teacher, str(row.steps)]


def to_markdown(table: Table) -> str:
    best = table.best()
    cols = [*FIXED, *(header(c) for c in table.columns)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.rows:
        cells = _fixed(table, row) + [_cell(table, row, c, best, ("**", "**")) for c in table.columns]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Best per column in bold; deltas in parentheses are against `{table.baseline}`.")
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    best = table.best()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        [
            "run_id",
            "domain",
            "method",
            "student",
            "teacher",
            "steps",
            "baseline",
            *table.columns,
            *(f"{c}_delta" for c in table.columns),
            "best_in",
        ]
    )
    for row in table.rows:
        values = [table.value(row, c) for c in table.columns]
        deltas = [table.delta(row, c) for c in table.columns]
        writer.writerow(
            [
                row.run_id,
                row.domain,
                row.method,
                row.student,
                row.teacher,
                row.steps,
                row.run_id == table.baseline,
                *("" if v is None else repr(v) for v in values),
                *("" if d is None else repr(d) for d in deltas),
                ";".join(c for c in table.columns if row.run_id in best.get(c, [])),
            ]
        )
    return buf.getvalue()


def to_json(table: Table, plot: Path | None = None) -> str:
    return json.dumps(
        {
            "baseline": table.baseline,
            "columns": table.columns,
            "best": table.best(),
            "rows": [
                {
                    "run_id": r.run_id,
                    "domain": r.domain,
                    "method": r.method,
                    "student": r.student,
                    "teacher": r.teacher,
                    "steps": r.steps,
                    "metrics": {c: table.value(r, c) for c in table.columns},
                    "deltas": {c: table.delta(r, c) for c in table.columns},
                }
                for r in table.rows
            ],
            "plot": str(plot) if plot else None,
        },
        indent=2,
    )


def print_table(table: Table, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table as RichTable

    best = table.best()
    out = RichTable(
        title="compare", caption=f"best per column in bold green; deltas against {table.baseline}"
    )
    for col in (*FIXED, *(header(c) for c in table.columns)):
        out.add_column(col, justify="right" if col not in FIXED[:5] else "left")
    for row in table.rows:
        cells = [escape(c) for c in _fixed(table, row)]
        cells += [_cell(table, row, c, best, ("[bold green]", "[/bold green]")) for c in table.columns]
        out.add_row(*cells)
    console.print(out)


def curve_label(table: Table, row: Row) -> str:
    """A run's legend entry: its method, and its teacher where the runs differ in it (the same
    method against another teacher, e.g. a cross-family pair, must not read like the same run)."""
    if len({r.teacher for r in table.rows}) > 1:
        return f"{row.run_id} ({row.method} <- {row.teacher})"
    return f"{row.run_id} ({row.method})"


def plot_curves(table: Table, path: Path) -> Path:
    """Eval curves of every run, one panel per benchmark."""
    from distill.diagnose.plots import draw, integer_steps, new_figure, save

    benches = sorted({key.split("/")[1] for r in table.rows for key in r.curves})
    fig = new_figure(7.5, 3.6 * max(1, len(benches)))
    for i, bench in enumerate(benches or ["(none)"], 1):
        ax = fig.add_subplot(max(1, len(benches)), 1, i)
        ylabel = "score"
        for row in table.rows:
            for key, s in row.curves.items():
                if key.split("/")[1] == bench:
                    draw(ax, s, label=curve_label(table, row))
                    ylabel = key.split("/")[-1]
        integer_steps(ax)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"eval curves: {bench}", fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    return save(fig, path)
