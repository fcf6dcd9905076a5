"""Loading a run: metrics.jsonl into series, the config (known or not), eval files, samples."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from distill.diagnose.records import RunNotReadable, Series, load_run, read_metrics

from .conftest import MakeRun


def test_metrics_lines_sharing_a_step_nan_strings_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0, "eval/rlve/avg@1": 0.1}\n'
        '{"step": 1, "train/loss": 2.0, "train/grad_norm": "nan"}\n'
        '{"step": 2, "train/loss": 1.5}\n'
        '{"step": 2, "eval/rlve/avg@1": 0.3}\n'
        '{"step": 3, "train/lo'
    )
    series, problems = read_metrics(path)
    assert series["train/loss"].steps.tolist() == [1, 2] and series["train/loss"].values.tolist() == [
        2.0,
        1.5,
    ]
    assert series["eval/rlve/avg@1"].steps.tolist() == [0, 2]
    assert math.isnan(series["train/grad_norm"].values[0])
    assert problems == ["metrics.jsonl line 5: not a metrics row, skipped"]


def test_series_windows_slope_and_span() -> None:
    steps = np.arange(1, 101)
    s = Series("x", steps, 3.0 - 0.01 * steps.astype(float))
    assert s.slope() == pytest.approx(-0.01)
    tail = s.window(0.2, last=True)
    assert len(tail) == 20 and tail.span() == "steps 81-100"
    assert s.window(0.2, last=False).span() == "steps 1-20"
    assert Series("y", np.array([5]), np.array([1.0])).slope() == 0.0
    assert Series("y", np.array([5]), np.array([1.0])).span() == "step 5"


def test_load_by_id_prefix_and_path_and_missing(make_run: MakeRun) -> None:
    run_dir = make_run("20260101-000000-rlve-opd-abcd", metrics=[{"step": 1, "train/loss": 1.0}])
    for ref in ("20260101-000000-rlve-opd-abcd", "20260101-000000-rlve", str(run_dir)):
        rec = load_run(ref)
        assert rec.run_dir == run_dir and rec.name == run_dir.name
        assert rec.method == "opd" and rec.run_config is not None
    with pytest.raises(RunNotReadable, match="no run 'nope'"):
        load_run("nope")


def test_unknown_method_config_still_loads_raw(make_run: MakeRun) -> None:
    make_run("future-run", method={"name": "future", "prefix_tokens": 1024, "teacher_max_tokens": 1024})
    rec = load_run("future-run")
    assert rec.run_config is None  # a method this version's RunConfig does not know
    assert rec.method == "future" and rec.cfg("method.prefix_tokens") == 1024
    assert rec.cfg("method.nope", "dflt") == "dflt" and rec.preflight is None


def test_eval_files_and_samples(make_run: MakeRun) -> None:
    make_run(
        "r",
        metrics=[{"step": 0, "eval/rlve/avg@4": 0.25, "teacher/eval/rlve/avg@4": 0.9}],
        evals={0: ({"avg@4": 0.25}, [{"id": "a", "correct": 1, "k": 4, "responses": ["x"], "truncated": 0}])},
        samples={1: [{"student": "\\boxed{3}"}], 2: [{"student": "no"}]},
    )
    rec = load_run("r")
    assert rec.benches() == ["rlve"]  # teacher/eval/... is the teacher, not a student benchmark
    assert rec.eval_steps() == [0]
    ev = rec.eval_file(0)
    assert ev is not None and ev.metrics == {"avg@4": 0.25} and ev.rows[0]["id"] == "a"
    assert rec.eval_file(9) is None
    assert [r["student"] for r in rec.sample_rows()] == ["\\boxed{3}", "no"]
    assert [r["student"] for r in rec.sample_rows(first_steps=1)] == ["\\boxed{3}"]
