"""The reference documents' table for a grid: rows = methods, columns = each domain's final eval
metrics (avg@k / pass@k / solved, or Score / Success / Pass(>0)), mean ± std over seeds, the best
method per column marked, the student before training and the teacher as reference rows, and the
lift of the domain's first metric over the student before. Markdown, CSV, a grouped-bar PNG and
the numbers for the grid's MLflow run; `cli/grid.py` prints it.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill import registry
from distill.diagnose.compare import NAMED

# Row labels of the two reference rows (not methods).
BEFORE, TEACHER = "student (before)", "teacher"


@dataclass
class GridTable:
    domains: list[str]
    methods: list[str]
    # domain -> its metric keys, in column order (the first is the one lifts are taken on).
    columns: dict[str, list[str]]
    # (row, domain, key) -> one value per seed (rows: methods, BEFORE, TEACHER).
    values: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    # cell label -> (status, diagnose counts, finding names at warning or above)
    cells: dict[str, tuple[str, dict[str, int], list[str]]] = field(default_factory=dict)
    budgets: dict[str, str] = field(default_factory=dict)
    # (method, domain) -> its own cells' student before, first metric, one per seed: a scoped
    # override may give one method another student (opsd:student.name=zoo:student-privileged).
    befores: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def rows(self) -> list[str]:
        return [BEFORE, *self.methods, TEACHER]

    def keys(self) -> list[tuple[str, str]]:
        """(domain, metric) of every column, in order."""
        return [(d, k) for d in self.domains for k in self.columns[d]]

    def entries(self, row: str) -> list[tuple[str, bool]]:
        """Row `row` as (text, best in its column) per column: what every rendering shows."""
        return [(self.text(row, d, k), row in self.best(d, k)) for d, k in self.keys()]

    def stats(self, row: str, domain: str, key: str) -> tuple[float, float | None, int] | None:
        """mean, sample std (None for one seed) and the number of seeds; None when nothing ran."""
        xs = self.values.get((row, domain, key), [])
        if not xs:
            return None
        return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None, len(xs)

    def best(self, domain: str, key: str) -> list[str]:
        means = {m: s[0] for m in self.methods if (s := self.stats(m, domain, key)) is not None}
        if not means:
            return []
        top = max(means.values())
        return [m for m, v in means.items() if math.isclose(v, top, abs_tol=1e-12)]

    def lift(self, row: str, domain: str) -> float | None:
        """Over the row's own student before where its cells have one, else the reference row."""
        key = self.columns[domain][0]
        after, before = self.stats(row, domain, key), self.before(row, domain)
        return None if after is None or before is None else after[0] - before

    def before(self, row: str, domain: str) -> float | None:
        own = self.befores.get((row, domain))
        return statistics.fmean(own) if own else self._reference(domain)

    def _reference(self, domain: str) -> float | None:
        """The reference row's mean in the domain's first column."""
        ref = self.stats(BEFORE, domain, self.columns[domain][0]) if self.columns[domain] else None
        return ref[0] if ref else None

    def other_students(self) -> list[tuple[str, str, float]]:
        """(method, domain, its before) for every method that started from another student than
        the reference row's."""
        out = []
        for d in self.domains:
            ref = self._reference(d)
            for m in self.methods:
                own = self.before(m, d)
                if ref is not None and own is not None and not math.isclose(own, ref, abs_tol=1e-9):
                    out.append((m, d, own))
        return out

    def lift_at(self, row: str, domain: str, key: str) -> float | None:
        """The lift where it is shown: a method's row, in its domain's first column."""
        first = key == self.columns[domain][0] and row in self.methods
        return self.lift(row, domain) if first else None

    def text(self, row: str, domain: str, key: str) -> str:
        s = self.stats(row, domain, key)
        if s is None:
            return "-"
        mean, std, _ = s
        out = _fmt(key, mean) + (f" ± {_fmt(key, std)}" if std is not None else "")
        lift = self.lift_at(row, domain, key)
        return out + (f" ({_signed(key, lift)})" if lift is not None else "")


def _percent(key: str) -> bool:
    return key.startswith(("avg@", "pass@", "accuracy", "success", "pass_gt0"))


def _fmt(key: str, value: float) -> str:
    if _percent(key):
        return f"{100 * value:.1f}"
    return f"{value:.0f}" if key == "solved" else f"{value:.3f}"


def _signed(key: str, value: float) -> str:
    text = _fmt(key, abs(value))
    return ("+" if value >= 0 else "-") + text


def header(key: str) -> str:
    name = NAMED.get(key, key)
    return f"{name} %" if _percent(key) and key not in NAMED else name


def metric_keys(results: list[dict[str, Any]]) -> list[str]:
    """A domain's columns from its cells' final evals: avg@k (largest k first), pass@k, solved, or
    Score, Success, Pass(>0)."""
    keys = {k for r in results for k, v in r.items() if isinstance(v, int | float)}
    if "score" in keys:
        return [k for k in ("score", "success", "pass_gt0") if k in keys]
    at = sorted(
        (k for k in keys if k.startswith(("avg@", "pass@"))),
        key=lambda k: (k[0] != "a", -int(k.split("@")[1])),
    )
    return at + (["solved"] if "solved" in keys else []) or (["accuracy"] if "accuracy" in keys else [])


def build(domains: list[str], methods: list[str], cells: list[tuple[Any, dict[str, Any]]]) -> GridTable:
    """`cells`: (a grid cell: .domain .method .seed .label, its run's summary.json) for every cell
    that has one. The reference rows take each seed's values once, whatever the methods."""
    columns = {
        d: metric_keys(
            [s.get("student_after") or s.get("student_before") or {} for c, s in cells if c.domain == d]
        )
        for d in domains
    }
    table = GridTable(domains, methods, columns)

    def add(row: str, domain: str, scores: Any) -> None:
        for key in columns[domain]:
            if isinstance(scores, dict) and isinstance(scores.get(key), int | float):
                table.values.setdefault((row, domain, key), []).append(float(scores[key]))

    firsts = {d: keys[0] if keys else "" for d, keys in columns.items()}
    refs: dict[tuple[str, str, int], list[Any]] = {}
    for cell, summary in cells:
        diag = summary.get("diagnose") or {}
        table.cells[cell.label] = (
            str(summary.get("status", "?")),
            diag.get("counts", {}),
            diag.get("findings", []),
        )
        if summary.get("status") == "FINISHED":  # an unfinished cell has no final eval
            add(cell.method, cell.domain, summary.get("student_after"))
        before = (summary.get("student_before") or {}).get(firsts[cell.domain])
        if isinstance(before, int | float):
            table.befores.setdefault((cell.method, cell.domain), []).append(float(before))
        for row, part in ((BEFORE, "student_before"), (TEACHER, "teacher_score")):
            own = (entry := registry.METHODS.get(cell.method)) is not None and entry.own_teacher
            if summary.get(part) and not (row == TEACHER and own):  # its teacher is itself
                refs.setdefault((row, cell.domain, cell.seed), []).append(summary[part])
    for (row, domain, _), candidates in refs.items():
        # The student most cells of this seed started from (a method may have had its own).
        counts = Counter(c.get(firsts[domain]) for c in candidates)
        add(row, domain, max(candidates, key=lambda c: counts[c.get(firsts[domain])]))
    return table


def student_notes(table: GridTable) -> list[str]:
    """One line per method that started from another student than the reference row's."""
    return [
        f"{m} on {d} started from another student ({header(table.columns[d][0])} "
        f"{_fmt(table.columns[d][0], before)} before): its lift is over that."
        for m, d, before in table.other_students()
    ]


def to_markdown(table: GridTable) -> str:
    head = ["method"] + [f"{d} {header(k)}" for d, k in table.keys()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table.rows():
        marked = [f"**{text}**" if best else text for text, best in table.entries(row)]
        lines.append("| " + " | ".join([row, *marked]) + " |")
    notes = [f"- {d}: {b}" for d, b in table.budgets.items()]
    return (
        "\n".join(lines)
        + "\n\nMean ± std over seeds; (+x): lift over the student before.\n"
        + "".join(line + "\n" for line in student_notes(table))
        + ("Budgets per domain:\n" + "\n".join(notes) + "\n" if notes else "")
    )


def to_csv(table: GridTable) -> str:
    """One line per (row, domain, metric): mean, std, seeds, lift; plain numbers for other tools."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["row", "domain", "metric", "mean", "std", "seeds", "lift", "best"])
    for row in table.rows():
        for d, k in table.keys():
            s = table.stats(row, d, k)
            if s is None:
                continue
            lift = table.lift_at(row, d, k)
            w.writerow(
                [
                    row,
                    d,
                    k,
                    f"{s[0]:.6g}",
                    "" if s[1] is None else f"{s[1]:.6g}",
                    s[2],
                    "" if lift is None else f"{lift:.6g}",
                    int(row in table.best(d, k)),
                ]
            )
    return buf.getvalue()


def mlflow_metrics(table: GridTable) -> dict[str, float]:
    """`grid/<domain>/<row>/<metric>` means (and `.../lift`) for the grid's parent run."""
    out: dict[str, float] = {}
    for row in table.rows():
        name = row.replace(" ", "_").replace("(", "").replace(")", "")
        for d in table.domains:
            for k in table.columns[d]:
                s = table.stats(row, d, k)
                if s is not None:
                    out[f"grid/{d}/{name}/{k}"] = s[0]
            lift = table.lift(row, d) if row in table.methods else None
            if lift is not None:
                out[f"grid/{d}/{name}/lift"] = lift
    return out


def plot(table: GridTable, path: Path) -> Path:
    """One panel per domain: a bar per method (its first metric's mean, std as error bar), the
    student before and the teacher as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table.domains), figsize=(4.2 * len(table.domains), 3.6), squeeze=False)
    for ax, d in zip(axes[0], table.domains, strict=True):
        draw_panel(ax, table, d)
    fig.suptitle("distill grid: final eval per method (mean ± std over seeds)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_panel(ax: Any, table: GridTable, d: str) -> None:
    """Domain `d`'s panel. A method that started from another student gets its own "before" as a
    dotted mark across its bar: against the common line its bar would show a lift it never made."""
    key = table.columns[d][0] if table.columns[d] else None
    if key is None:
        ax.set_title(f"{d}: no results yet")
        return
    scale = 100.0 if _percent(key) else 1.0  # the axis in the table's units
    stats = [table.stats(m, d, key) for m in table.methods]
    means = [scale * s[0] if s else 0.0 for s in stats]
    errs = [scale * (s[1] or 0.0) if s else 0.0 for s in stats]
    bars = ax.bar(table.methods, means, yerr=errs, capsize=4, color="tab:blue", alpha=0.8)
    for bar, s in zip(bars, stats, strict=True):
        if s is None:
            bar.set_alpha(0.15)
    for row, style in ((BEFORE, "tab:gray"), (TEACHER, "tab:green")):
        ref = table.stats(row, d, key)
        if ref is not None:
            ax.axhline(scale * ref[0], linestyle="--", color=style, label=row)
    own = [(m, before) for m, dom, before in table.other_students() if dom == d]
    for n, (m, before) in enumerate(own):
        x = table.methods.index(m)  # categorical bars sit at 0, 1, ... and are 0.8 wide
        label = None if n else "own student (before)"  # one legend entry for all of them
        ax.hlines(scale * before, x - 0.4, x + 0.4, colors="black", linestyles=":", linewidth=2, label=label)
    ax.set_title(f"{d}: {header(key)}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")  # bars reach anywhere from the floor to the teacher
