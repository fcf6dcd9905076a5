"""Eval divergence, early zero reward, and student/teacher pairing mismatches."""

from __future__ import annotations

from distill.diagnose import Severity, load_run
from distill.diagnose.outcomes import (
    early_reward,
    eval_divergence,
    eval_regression,
    kl_rising,
    pairing,
    teacher_gap,
)

from .conftest import MakeRun
from .fake_runs import eval_rows, series_rows


def _item(i: int, correct: int, k: int = 16) -> dict:
    return {"id": f"p{i}", "correct": correct, "k": k, "responses": ["..."], "truncated": 0}


def test_avg_falls_while_pass_rises_with_per_problem_evidence(make_run: MakeRun) -> None:
    # DAPO-Math shape: one problem goes 0/16 -> 1/16 (pass@16 up), two others lose samples (avg@16 down).
    before = [_item(0, 0), _item(1, 8), _item(2, 6), _item(3, 0)]
    after = [_item(0, 1), _item(1, 5), _item(2, 4), _item(3, 0)]
    m0 = {"avg@16": 14 / 64, "pass@16": 0.5, "pass@1": 14 / 64}
    m1 = {"avg@16": 10 / 64, "pass@16": 0.75, "pass@1": 10 / 64}
    make_run(
        "div",
        config={"eval.k": 16},
        metrics=[eval_rows("aime25", 0, m0), eval_rows("aime25", 30, m1)],
        evals={0: (m0, before), 30: (m1, after)},
    )
    [f] = eval_divergence(load_run("div"))
    assert f.name == "eval_divergence:aime25" and f.severity is Severity.WARNING
    assert "avg@16 fell (0.219 -> 0.156)" in f.title and "pass@16 rose (0.5 -> 0.75)" in f.title
    texts = [e.text() for e in f.evidence]
    assert "eval/step-0.jsonl vs step-30.jsonl = 2 problems fell, 1 rose" in texts
    assert "rose = p0: 0/16 -> 1/16" in texts and "fell = p1: 8/16 -> 5/16" in texts
    assert [x.override for x in f.fixes] == ["eval.k=32"]


def test_no_divergence_when_both_rise_or_k_is_1(make_run: MakeRun) -> None:
    make_run(
        "up",
        metrics=[
            eval_rows("rlve", 0, {"avg@4": 0.2, "pass@4": 0.4}),
            eval_rows("rlve", 9, {"avg@4": 0.3, "pass@4": 0.5}),
        ],
    )
    assert eval_divergence(load_run("up")) == []
    make_run(
        "k1",
        metrics=[
            eval_rows("rlve", 0, {"avg@1": 0.3, "pass@1": 0.3}),
            eval_rows("rlve", 9, {"avg@1": 0.2, "pass@1": 0.2}),
        ],
    )
    assert eval_divergence(load_run("k1")) == []


def test_early_zero_reward_explained_by_truncation(make_run: MakeRun) -> None:
    metrics = series_rows(20, student__accuracy=lambda s: 0.0, student__truncation_rate=lambda s: 0.9)
    make_run(
        "trunc",
        config={"rollout.max_new_tokens": 256},
        metrics=metrics,
        summary={"teacher_score": {"accuracy": 0.6}},
    )
    [f] = early_reward(load_run("trunc"))
    assert f.severity is Severity.WARNING and "runs out of tokens" in f.title
    assert [x.override for x in f.fixes] == ["rollout.max_new_tokens=512"]
    assert any(e.source == "teacher eval accuracy" and e.value == "60.0%" for e in f.evidence)


def test_early_zero_reward_explained_by_format(make_run: MakeRun) -> None:
    metrics = series_rows(20, student__accuracy=lambda s: 0.0, student__truncation_rate=lambda s: 0.0)
    samples = {1: [{"student": "the answer is 4"}] * 3 + [{"student": "\\boxed{4}"}]}
    make_run("fmt", metrics=metrics, samples=samples)
    [f] = early_reward(load_run("fmt"))
    assert "\\boxed{} format" in f.title and f.severity is Severity.WARNING
    assert any(e.value == "25.0%" for e in f.evidence)


def test_early_zero_reward_simply_weak_is_info_and_nonzero_is_quiet(make_run: MakeRun) -> None:
    metrics = series_rows(20, student__accuracy=lambda s: 0.0, student__truncation_rate=lambda s: 0.0)
    make_run("weak", metrics=metrics, samples={1: [{"student": "\\boxed{5}"}] * 4})
    [f] = early_reward(load_run("weak"))
    assert f.severity is Severity.INFO and "simply weak" in f.title
    make_run("fine", metrics=series_rows(20, student__accuracy=lambda s: 0.3))
    assert early_reward(load_run("fine")) == []


def test_thinking_mode_mismatch(make_run: MakeRun) -> None:
    make_run("explicit", config={"student.enable_thinking": False, "teacher.enable_thinking": True})
    [f] = pairing(load_run("explicit"))
    assert f.name == "thinking_mismatch" and f.severity is Severity.ERROR
    assert [x.override for x in f.fixes] == ["teacher.enable_thinking=false"]
    make_run("default", config={"student.enable_thinking": None, "teacher.enable_thinking": False})
    [f] = pairing(load_run("default"))
    assert f.severity is Severity.WARNING and "family's default" in f.title
    make_run("same", config={"student.enable_thinking": True, "teacher.enable_thinking": True})
    assert pairing(load_run("same")) == []


def test_cross_family_vocab_and_preflight(make_run: MakeRun) -> None:
    models = {
        "student": {"class": "Olmo3ForCausalLM", "vocab": 100278},
        "teacher": {"class": "Qwen3ForCausalLM", "vocab": 151669},
    }
    make_run("opd-x", manifest={"models": models})
    [f] = pairing(load_run("opd-x"))
    assert f.name == "cross_family" and f.severity is Severity.ERROR and "100278 vs 151669" in f.title
    assert [x.override for x in f.fixes] == ["method.name=rose"]
    make_run(
        "rose-x",
        method={"name": "rose"},
        manifest={"models": models},
        preflight={"seam": {"student_roundtrip": {"ok": True}, "teacher_roundtrip": {"ok": False}}},
    )
    found = {f.name: f for f in pairing(load_run("rose-x"))}
    assert found["cross_family"].severity is Severity.INFO
    assert found["preflight_failed"].title == "preflight check failed: seam.teacher_roundtrip"


def test_eval_regression_flags_a_student_made_worse(make_run: MakeRun) -> None:
    # The shape of a real OPD run at lr 1e-3 on the embedded default: 45% -> 11.5% by step 50.
    make_run(
        "worse",
        config={"optim.lr": 1e-3},
        metrics=[eval_rows("rlve", 0, {"accuracy": 0.45}), eval_rows("rlve", 50, {"accuracy": 0.115})],
    )
    [f] = eval_regression(load_run("worse"))
    assert f.severity is Severity.ERROR and f.name == "eval_regression:rlve"
    assert "45.0% to 11.5% (step 50)" in f.title
    assert [x.override for x in f.fixes] == ["optim.lr=0.00033", "method.advantage_clip=5"]
    # A small dip that recovers is a warning; a rise is nothing.
    make_run(
        "dip",
        metrics=[
            eval_rows("rlve", 0, {"accuracy": 0.45}),
            eval_rows("rlve", 50, {"accuracy": 0.38}),
            eval_rows("rlve", 100, {"accuracy": 0.46}),
        ],
    )
    [g] = eval_regression(load_run("dip"))
    assert g.severity is Severity.WARNING
    make_run(
        "up", metrics=[eval_rows("rlve", 0, {"accuracy": 0.45}), eval_rows("rlve", 50, {"accuracy": 0.7})]
    )
    assert eval_regression(load_run("up")) == []


def test_kl_rising_fires_only_when_the_student_drifts_from_its_teacher(make_run: MakeRun) -> None:
    make_run(
        "drift",
        config={"optim.lr": 3e-3},
        metrics=series_rows(50, kl__reverse_kl_mean=lambda s: 0.5 + 0.04 * s),
    )
    [f] = kl_rising(load_run("drift"))
    assert f.name == "kl_rising" and [x.override for x in f.fixes] == ["optim.lr=0.001"]
    make_run("falling", metrics=series_rows(50, kl__reverse_kl_mean=lambda s: 1.0 - 0.01 * s))
    assert kl_rising(load_run("falling")) == []


def test_teacher_gap_flags_a_student_that_barely_moved(make_run: MakeRun) -> None:
    # The embedded default's OPD run: 45.0% -> 48.5% with a 99% teacher.
    scores = {
        "student_before": {"accuracy": 0.45},
        "student_after": {"accuracy": 0.485},
        "teacher_score": {"accuracy": 0.99},
        "status": "FINISHED",
    }
    make_run("flat", config={"optim.max_steps": 200}, summary=scores)
    [f] = teacher_gap(load_run("flat"))
    assert f.severity is Severity.WARNING and "closed 6.5% of the gap" in f.title
    assert [x.override for x in f.fixes] == ["method.name=sft", "optim.max_steps=400"]
    make_run("closed", summary={**scores, "student_after": {"accuracy": 0.75}})
    assert teacher_gap(load_run("closed")) == []
