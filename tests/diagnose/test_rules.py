"""Budget and dynamics rules: each pathology fires with its numbers and fix; healthy runs stay quiet."""

from __future__ import annotations

import math

import pytest

from distill.diagnose import Severity, diagnose, load_run
from distill.diagnose.dynamics import plateau
from distill.diagnose.rules import coverage, run_status, student_truncation, teacher_truncation

from .conftest import MakeRun
from .fake_runs import HEALTHY_CONFIG, eval_rows, healthy_metrics, series_rows

# The reference's DAPO-Math ROSE run: t = 1024, targets 960-1016 tokens, a 16-18.6k-token chain, K = 1024.
DAPO_ROSE = {"name": "rose", "prefix_tokens": 1024, "teacher_max_tokens": 1024}


def _dapo_rose_metrics(steps: int = 40) -> list[dict]:
    return series_rows(
        steps,
        train__ce_loss=lambda s: 0.9,
        teacher__truncation_rate=lambda s: 0.92,
        teacher__ce_target_share=lambda s: 0.94 + 0.05 * (s % 2),
        teacher__ce_target_tokens_mean=lambda s: 980.0,
        teacher__ce_target_tokens_max=lambda s: 960.0 + s,
        coverage__supervised_share=lambda s: 0.06,
        student__completion_tokens_mean=lambda s: 17000.0,
    )


def _one(findings: list, name: str):
    matches = [f for f in findings if f.name == name]
    assert len(matches) == 1, [f.name for f in findings]
    return matches[0]


def test_teacher_truncation_rose_reference_numbers(make_run: MakeRun) -> None:
    make_run("rose", method=DAPO_ROSE, metrics=_dapo_rose_metrics())
    f = _one(teacher_truncation(load_run("rose")), "teacher_truncation")
    assert f.severity is Severity.ERROR
    values = {e.source: e.value for e in f.evidence}
    assert values["teacher/truncation_rate"] == pytest.approx(0.92)
    assert values["teacher/ce_target_share"] == pytest.approx(0.965)
    assert values["teacher/ce_target_tokens_max"] == 1000.0 and values["method.teacher_max_tokens"] == 1024
    assert [x.override for x in f.fixes] == ["method.teacher_max_tokens=2048"]  # >= 2 x 1000, a power of two
    assert "steps 1-40" in f.evidence[0].text()


def test_teacher_truncation_sft_names_the_rollout_budget_and_tiers(make_run: MakeRun) -> None:
    metrics = [
        {
            "step": 0,
            "teacher/truncation_rate": 0.3,
            "teacher/ce_target_share": 0.8,
            "teacher/ce_target_tokens_max": 64.0,
        }
    ]
    make_run("sft", config={"method.name": "sft", "rollout.max_new_tokens": 64}, metrics=metrics)
    f = _one(teacher_truncation(load_run("sft")), "teacher_truncation")
    assert f.severity is Severity.WARNING
    assert [x.override for x in f.fixes] == ["rollout.max_new_tokens=128"]
    make_run(
        "ok",
        config={"method.name": "sft"},
        metrics=[{"step": 0, "teacher/truncation_rate": 0.05, "teacher/ce_target_share": 0.4}],
    )
    assert teacher_truncation(load_run("ok")) == []


def test_coverage_reference_case_raises_t_then_k(make_run: MakeRun) -> None:
    make_run("rose", method=DAPO_ROSE, metrics=_dapo_rose_metrics())
    f = _one(coverage(load_run("rose")), "supervision_coverage")
    assert f.severity is Severity.ERROR and "6.0%" in f.title
    assert [x.override for x in f.fixes] == ["method.teacher_max_tokens=2048", "method.prefix_tokens=4096"]
    assert "tokens 1024-2048" in f.why


def test_coverage_without_teacher_truncation_raises_k_only(make_run: MakeRun) -> None:
    metrics = series_rows(
        10,
        coverage__supervised_share=lambda s: 0.2,
        teacher__truncation_rate=lambda s: 0.0,
        teacher__ce_target_share=lambda s: 0.3,
        student__completion_tokens_mean=lambda s: 8000.0,
    )
    make_run(
        "rose", method={"name": "rose", "prefix_tokens": 512, "teacher_max_tokens": 1024}, metrics=metrics
    )
    f = _one(coverage(load_run("rose")), "supervision_coverage")
    assert f.severity is Severity.WARNING
    assert [x.override for x in f.fixes] == ["method.prefix_tokens=2048"]  # 8000 / 4, nearest power of two
    make_run("wide", method=DAPO_ROSE, metrics=series_rows(5, coverage__supervised_share=lambda s: 0.5))
    assert coverage(load_run("wide")) == []


def test_student_truncation_rising_and_eval_truncation(make_run: MakeRun) -> None:
    metrics = series_rows(
        50, student__truncation_rate=lambda s: 0.05 + 0.005 * s, student__completion_tokens_max=lambda s: 64.0
    )
    metrics += [
        eval_rows("rlve", 0, {"truncation_rate": 0.1, "response_tokens_p90": 40.0}),
        eval_rows("rlve", 50, {"truncation_rate": 0.6, "response_tokens_p90": 64.0}),
    ]
    make_run("t", config={"rollout.max_new_tokens": 64, "eval.max_new_tokens": 64}, metrics=metrics)
    found = student_truncation(load_run("t"))
    roll = _one(found, "student_truncation")
    assert roll.severity is Severity.WARNING and "rising" in roll.title
    start, end, trend = roll.evidence[:3]
    assert start.value == pytest.approx(0.05 + 0.005 * 5.5) and end.value == pytest.approx(
        0.05 + 0.005 * 45.5
    )
    assert "fitted rise +0.24" in str(trend.value)
    assert [x.override for x in roll.fixes] == ["rollout.max_new_tokens=128"]
    ev = _one(found, "eval_truncation:rlve")
    assert ev.severity is Severity.ERROR  # ends at 60% >= 50%
    assert [x.override for x in ev.fixes] == ["eval.max_new_tokens=128"]


def test_plateau_and_grad_collapse_reference_shape(make_run: MakeRun) -> None:
    # ce_loss falls to step 30 then slopes -0.00012/step; grad_norm 2.0 -> 0.18.
    def ce(s: int) -> float:
        return 2.0 - 0.035 * min(s, 30) - 0.00012 * max(0, s - 30)

    metrics = series_rows(100, train__ce_loss=ce, train__grad_norm=lambda s: 2.0 if s <= 20 else 0.18)
    make_run("flat", method=DAPO_ROSE, config={"optim.lr": 1e-6}, metrics=metrics)
    f = _one(plateau(load_run("flat")), "training_stalled")
    assert f.severity is Severity.WARNING and "loss plateau and grad_norm collapse" in f.title
    slope = f.evidence[0]
    assert slope.source == "train/ce_loss slope" and "-1.20e-04/step" in str(slope.value)
    since = next(e for e in f.evidence if e.source.endswith("flat since"))
    assert since.value == "step 31"
    grads = [e.value for e in f.evidence if e.source == "train/grad_norm"]
    assert grads == [2.0, 0.18]
    assert "optim.max_steps=31" in [x.override for x in f.fixes]


def test_run_status_failed(make_run: MakeRun) -> None:
    make_run("bad", summary={"status": "FAILED", "error": "OSError: disk full"})
    f = _one(run_status(load_run("bad")), "run_failed")
    assert f.severity is Severity.ERROR and "disk full" in f.title
    # The failure says why nothing was logged: no second warning for it.
    assert [x.name for x in run_status(load_run("bad"))] == ["run_failed"]
    make_run("empty", summary={"status": "FINISHED"})
    assert [x.name for x in run_status(load_run("empty"))] == ["no_metrics"]


def test_healthy_run_has_no_errors_or_warnings(make_run: MakeRun) -> None:
    make_run(
        "good",
        config=HEALTHY_CONFIG,
        metrics=healthy_metrics(),
        summary={"student_after": {"avg@4": 0.4, "pass@4": 0.6}},
    )
    findings = diagnose(load_run("good"))
    assert [f for f in findings if f.severity >= Severity.WARNING] == [], [f.title for f in findings]


def test_rose_healthy_run_with_budget_keys_is_quiet(make_run: MakeRun) -> None:
    metrics = healthy_metrics()
    for row in metrics:
        if "train/loss" in row:
            row.update(
                {
                    "train/ce_loss": row["train/loss"],
                    "teacher/truncation_rate": 0.05,
                    "teacher/ce_target_share": 0.5,
                    "coverage/supervised_share": 0.45,
                }
            )
    make_run(
        "rose-good",
        method={"name": "rose", "prefix_tokens": 256, "teacher_max_tokens": 512},
        config=HEALTHY_CONFIG,
        metrics=metrics,
    )
    findings = diagnose(load_run("rose-good"))
    assert max((f.severity for f in findings), default=Severity.INFO) is Severity.INFO
    assert not math.isnan(load_run("rose-good").get("coverage/supervised_share").mean())
