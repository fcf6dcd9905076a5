"""Speed rules: how much of the teacher's time an async run hid, when to suggest it, slow tracking."""

from __future__ import annotations

import pytest

from distill.diagnose import Severity, load_run
from distill.diagnose.speed import teacher_time, tracking_time

from .conftest import MakeRun
from .fake_runs import series_rows


def test_async_run_reports_the_hidden_share(make_run: MakeRun) -> None:
    metrics = series_rows(
        20,
        # The first step scores synchronously while the worker loads its teacher: not a bottleneck.
        perf__teacher_time_s=lambda s: 20.0 if s == 1 else 0.4,
        perf__teacher_wait_s=lambda s: 19.0 if s == 1 else 0.03,
        perf__overlap_s=lambda s: 1.0 if s == 1 else 0.37,
        perf__step_time_s=lambda s: 21.0 if s == 1 else 0.6,
    )
    make_run("a", config={"rollout.async_teacher": True}, metrics=metrics)
    (f,) = teacher_time(load_run("a"))
    assert (f.name, f.severity) == ("teacher_overlap", Severity.INFO)
    assert "92.5%" in f.title  # sum overlap / sum teacher time after the first step
    assert {e.source: e.value for e in f.evidence}["perf/teacher_wait_s (median)"] == pytest.approx(0.03)


def test_async_run_waiting_on_the_teacher_warns(make_run: MakeRun) -> None:
    metrics = series_rows(
        20,
        perf__teacher_time_s=lambda s: 1.0,
        perf__teacher_wait_s=lambda s: 0.7,
        perf__overlap_s=lambda s: 0.3,
        perf__step_time_s=lambda s: 1.2,
    )
    make_run("b", config={"rollout.async_teacher": True}, metrics=metrics)
    (f,) = teacher_time(load_run("b"))
    assert (f.name, f.severity) == ("teacher_bottleneck", Severity.WARNING)
    assert "30.0%" in f.title


def test_sync_run_with_a_slow_teacher_suggests_async(make_run: MakeRun) -> None:
    metrics = series_rows(20, perf__teacher_time_s=lambda s: 0.3, perf__step_time_s=lambda s: 0.9)
    make_run("c", metrics=metrics)
    (f,) = teacher_time(load_run("c"))
    assert f.name == "teacher_time" and [x.override for x in f.fixes] == ["rollout.async_teacher=true"]
    make_run(
        "d", metrics=series_rows(20, perf__teacher_time_s=lambda s: 0.1, perf__step_time_s=lambda s: 0.9)
    )
    assert teacher_time(load_run("d")) == []


def test_tracking_share_over_two_percent_warns(make_run: MakeRun) -> None:
    make_run("e", metrics=series_rows(20, perf__tracking_s=lambda s: 0.05, perf__step_time_s=lambda s: 1.0))
    (f,) = tracking_time(load_run("e"))
    assert f.severity is Severity.WARNING and "5.0%" in f.title
    make_run("f", metrics=series_rows(20, perf__tracking_s=lambda s: 0.001, perf__step_time_s=lambda s: 1.0))
    assert tracking_time(load_run("f")) == []
