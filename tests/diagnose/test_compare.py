"""The results table: columns from the runs' final evals, best per column, deltas, formats, plot."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from distill.diagnose import load_run
from distill.diagnose.compare import build_table, curve_label, plot_curves, to_csv, to_json, to_markdown

from .conftest import MakeRun
from .fake_runs import eval_rows

# Three rows of the reference's RLVE table (16k, n=8).
RLVE = {
    "base": {"avg@8": 0.0333, "pass@8": 0.1111, "pass@1": 0.0333, "solved": 20.0},
    "opd-fp32": {"avg@8": 0.0694, "pass@8": 0.1833, "pass@1": 0.0694, "solved": 33.0},
    "rose-seed1": {"avg@8": 0.0729, "pass@8": 0.1889, "pass@1": 0.0729, "solved": 34.0},
}


@pytest.fixture
def rlve_runs(make_run: MakeRun) -> list[str]:
    for name, after in RLVE.items():
        method = {"name": "rose"} if name.startswith("rose") else {"name": "opd"}
        start = {k: v * 0.5 for k, v in after.items()}
        make_run(
            name,
            method=method,
            config={"student.name": "/models/Qwen3-1.7B", "teacher.name": "Qwen/Qwen3-32B"},
            summary={"student_after": after, "steps": 140},
            metrics=[
                eval_rows("rlve", 0, start),
                eval_rows("rlve", 70, after),
                eval_rows("rlve", 140, after),
            ],
        )
    return list(RLVE)


def test_table_columns_best_and_deltas(rlve_runs: list[str]) -> None:
    table = build_table([load_run(r) for r in rlve_runs])
    assert table.columns == ["avg@8", "pass@8", "pass@1", "solved"]
    assert table.baseline == "base"
    assert table.best() == {c: ["rose-seed1"] for c in table.columns}
    rose = table.rows[2]
    assert (rose.student, rose.teacher, rose.steps) == ("Qwen3-1.7B", "Qwen/Qwen3-32B", 140)
    assert table.delta(rose, "avg@8") == pytest.approx(0.0396)
    assert table.delta(rose, "solved") == 14.0
    other = build_table([load_run(r) for r in rlve_runs], baseline="opd-fp32")
    assert other.delta(other.rows[0], "solved") == -13.0
    with pytest.raises(ValueError, match="baseline"):
        build_table([load_run("base")], baseline="rose-seed1")


def test_markdown_csv_json(rlve_runs: list[str], tmp_path: Path) -> None:
    table = build_table([load_run(r) for r in rlve_runs])
    md = to_markdown(table)
    assert "| run | domain | method | student | teacher | steps | avg@8 | pass@8 | pass@1 | solved |" in md
    assert "| base (baseline) |" in md and "**0.0729** (+0.0396)" in md and "**34** (+14)" in md
    rows = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert rows[2]["run_id"] == "rose-seed1" and float(rows[2]["avg@8_delta"]) == pytest.approx(0.0396)
    assert rows[2]["best_in"] == "avg@8;pass@8;pass@1;solved" and rows[0]["baseline"] == "True"
    data = json.loads(to_json(table, tmp_path / "p.png"))
    assert data["best"]["solved"] == ["rose-seed1"] and data["rows"][1]["deltas"]["solved"] == 13.0


def test_sciworld_columns_and_unfinished_run_uses_last_eval(make_run: MakeRun) -> None:
    make_run(
        "sft",
        config={"domain.name": "sciworld"},
        summary={"student_after": {"score": 0.2077, "success": 0.045, "pass_gt0": 0.41}},
    )
    make_run(
        "rose",
        config={"domain.name": "sciworld"},
        summary={"status": "KILLED"},
        metrics=[eval_rows("sciworld", 50, {"score": 0.3127, "success": 0.06, "pass_gt0": 0.5})],
    )
    table = build_table([load_run("sft"), load_run("rose")])
    assert table.columns == ["score", "success", "pass_gt0"]
    assert "| Score | Success | Pass(>0) |" in to_markdown(table)
    assert table.delta(table.rows[1], "score") == pytest.approx(0.105)


def test_plot_of_eval_curves(rlve_runs: list[str], tmp_path: Path) -> None:
    table = build_table([load_run(r) for r in rlve_runs])
    path = plot_curves(table, tmp_path / "compare" / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(table.rows[0].curves) == {"eval/rlve/avg@8"}


def test_curve_labels_name_the_teacher_only_where_the_runs_differ_in_it(
    rlve_runs: list[str], make_run: MakeRun
) -> None:
    same = build_table([load_run(r) for r in rlve_runs])
    assert [curve_label(same, r) for r in same.rows][1] == "opd-fp32 (opd)"
    make_run(
        "opd-llama",
        method={"name": "opd"},
        config={"student.name": "/models/Qwen3-1.7B", "teacher.name": "zoo:teacher-llama"},
        summary={"student_after": RLVE["opd-fp32"], "steps": 140},
        metrics=[eval_rows("rlve", 140, RLVE["opd-fp32"])],
    )
    mixed = build_table([load_run("opd-fp32"), load_run("opd-llama")])
    assert [curve_label(mixed, r) for r in mixed.rows] == [
        "opd-fp32 (opd <- Qwen/Qwen3-32B)",
        "opd-llama (opd <- zoo:teacher-llama)",
    ]
