"""The grid table's arithmetic: per-seed means and spreads, lifts, the best mark and the reference rows."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from distill.diagnose.grid_table import (
    BEFORE,
    TEACHER,
    build,
    draw_panel,
    metric_keys,
    mlflow_metrics,
    plot,
    to_csv,
    to_markdown,
)
from distill.grid import Cell


def _summary(before: float, after: float | None, teacher: float = 0.99, status: str = "FINISHED") -> dict:
    def scores(x: float) -> dict:
        return {"avg@1": x, "pass@1": x, "solved": 200 * x, "items": 200.0}

    out = {"status": status, "student_before": scores(before), "teacher_score": scores(teacher)}
    if after is not None:
        out["student_after"] = scores(after)
    out["diagnose"] = {"counts": {"error": 0, "warning": 1, "info": 0}, "findings": ["teacher_gap"]}
    return out


def _sciworld(score: float) -> dict:
    return {
        "status": "FINISHED",
        "student_before": {"score": 0.2, "success": 0.0, "pass_gt0": 0.5},
        "student_after": {"score": score, "success": 0.1, "pass_gt0": 0.9},
    }


def test_means_spreads_lifts_and_best() -> None:
    cells = [
        (Cell("rlve", "sft", 0), _summary(0.45, 0.75)),
        (Cell("rlve", "sft", 1), _summary(0.45, 0.65)),
        (Cell("rlve", "opd", 0), _summary(0.45, 0.60)),
        (Cell("rlve", "opd", 1), _summary(0.45, 0.62)),
        (Cell("rlve", "opsd", 0), _summary(0.45, 0.10, teacher=0.2)),
    ]
    table = build(["rlve"], ["sft", "opd", "opsd"], cells)
    assert table.columns["rlve"] == ["avg@1", "pass@1", "solved"]
    mean, std, n = table.stats("sft", "rlve", "avg@1")
    assert (mean, n) == (pytest.approx(0.70), 2) and std == pytest.approx(0.0707107, rel=1e-5)
    assert table.stats("opsd", "rlve", "avg@1")[1] is None  # one seed: no spread
    assert table.best("rlve", "avg@1") == ["sft"]
    assert table.lift("opd", "rlve") == pytest.approx(0.16)
    # The reference rows count each seed once (not once per method), and OPSD's teacher is not one.
    assert table.values[(BEFORE, "rlve", "avg@1")] == [0.45, 0.45]
    assert table.values[(TEACHER, "rlve", "avg@1")] == [0.99, 0.99]
    assert table.text("sft", "rlve", "avg@1") == "70.0 ± 7.1 (+25.0)"
    assert table.text("opsd", "rlve", "avg@1") == "10.0 (-35.0)"
    md = to_markdown(table)
    assert "| sft | **70.0 ± 7.1 (+25.0)** |" in md and "| opd | 61.0 ± 1.4 (+16.0) |" in md
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    sft = next(r for r in rows if r["row"] == "sft" and r["metric"] == "avg@1")
    assert (float(sft["mean"]), sft["seeds"], float(sft["lift"]), sft["best"]) == (0.7, "2", 0.25, "1")
    metrics = mlflow_metrics(table)
    assert metrics["grid/rlve/opd/lift"] == pytest.approx(0.16)
    assert metrics["grid/rlve/student_before/avg@1"] == pytest.approx(0.45)


def test_a_method_with_its_own_student_is_lifted_over_its_own_before() -> None:
    """`opsd:student.name=zoo:student-privileged`: OPSD's lift is over its own student, listed first
    here, while the reference row stays the student most cells started from."""
    cells = [
        (Cell("rlve", "opsd", 0), _summary(0.665, 0.75, teacher=0.81)),
        (Cell("rlve", "sft", 0), _summary(0.45, 0.75)),
        (Cell("rlve", "opd", 0), _summary(0.45, 0.70)),
    ]
    table = build(["rlve"], ["sft", "opd", "opsd"], cells)
    assert table.values[(BEFORE, "rlve", "avg@1")] == [0.45]
    assert table.lift("opsd", "rlve") == pytest.approx(0.085)
    assert table.lift("sft", "rlve") == pytest.approx(0.30)
    assert table.text("opsd", "rlve", "avg@1") == "75.0 (+8.5)"
    assert table.other_students() == [("opsd", "rlve", pytest.approx(0.665))]
    md = to_markdown(table)
    assert "opsd on rlve started from another student (avg@1 % 66.5 before)" in md
    assert "sft on rlve" not in md
    assert mlflow_metrics(table)["grid/rlve/opsd/lift"] == pytest.approx(0.085)


def test_the_plot_marks_a_methods_own_student_across_its_bar() -> None:
    """Against the common "student (before)" line alone, OPSD's bar would show a 30-point lift."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [
        (Cell("rlve", "sft", 0), _summary(0.45, 0.75)),
        (Cell("rlve", "opsd", 0), _summary(0.665, 0.75, teacher=0.81)),
    ]
    fig, ax = plt.subplots()
    draw_panel(ax, build(["rlve"], ["sft", "opsd"], cells), "rlve")
    (marks,) = [c for c in ax.collections if c.get_label() == "own student (before)"]  # OPSD's only
    ((x0, y0), (x1, y1)) = marks.get_segments()[0]
    assert (x0, x1) == pytest.approx((0.6, 1.4)) and y0 == y1 == pytest.approx(66.5)
    assert "own student (before)" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_unfinished_cells_count_in_no_mean_and_domains_keep_their_own_metrics(tmp_path: Path) -> None:
    cells = [
        (Cell("rlve", "opd", 0), _summary(0.45, None, status="RUNNING")),
        (Cell("rlve", "sft", 0), _summary(0.45, 0.7)),
        (Cell("sciworld", "sft", 0), _sciworld(0.4)),
        (Cell("sciworld", "opd", 0), _sciworld(0.3)),
    ]
    table = build(["rlve", "sciworld"], ["sft", "opd"], cells)
    assert table.stats("opd", "rlve", "avg@1") is None and table.text("opd", "rlve", "avg@1") == "-"
    assert table.cells["rlve/opd/s0"][0] == "RUNNING"
    assert table.columns["sciworld"] == ["score", "success", "pass_gt0"]
    assert table.text("sft", "sciworld", "score") == "0.400 (+0.200)"
    assert table.best("sciworld", "score") == ["sft"]
    png = plot(table, tmp_path / "grid.png")
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"


def test_metric_keys_put_the_largest_k_first() -> None:
    keys = metric_keys(
        [{"avg@1": 0.1, "avg@16": 0.2, "pass@16": 0.5, "pass@1": 0.1, "solved": 3, "items": 9}]
    )
    assert keys == ["avg@16", "avg@1", "pass@16", "pass@1", "solved"]
