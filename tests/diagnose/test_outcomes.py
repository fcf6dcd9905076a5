"""Eval divergence, early zero reward, and student/teacher pairing mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.diagnose import Fix, Severity, load_run
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
    # OPD crosses by byte groups: a note, not an error; OPSD with two vocabularies is an error.
    make_run("opd-x", manifest={"models": models})
    [f] = pairing(load_run("opd-x"))
    assert f.name == "cross_family" and f.severity is Severity.INFO and "100278 vs 151669" in f.title
    make_run("opsd-x", method={"name": "opsd"}, manifest={"models": models})
    [f] = pairing(load_run("opsd-x"))
    assert f.name == "cross_family" and f.severity is Severity.ERROR
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
    assert g.severity is Severity.INFO and "within 2 standard errors" in g.title
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


def _sciworld(method: dict, **config: object) -> dict:
    from distill.domains.sciworld.config import SciWorldDomainConfig

    return {"domain": SciWorldDomainConfig().model_dump(mode="json"), "method": method, **config}


def _accepted(rec_dir: Path, fixes: list[Fix]) -> None:
    """Every fix, applied as the override it names, is a config the run's domain accepts."""
    import yaml

    from distill.config import RunConfig, set_dotted

    data = yaml.safe_load((rec_dir / "config.yaml").read_text())
    for fix in fixes:
        set_dotted(data, fix.key.split("."), yaml.safe_load(fix.value))
    RunConfig.model_validate(data)


SW_OPD = {"name": "opd", "loss": "forward_kl_topk", "top_k": 8}


def test_a_sciworld_score_drop_is_a_regression_with_knobs_the_run_reads(make_run: MakeRun) -> None:
    # docs/sciworld.md: OPD with a teacher built without corrupt_prob took the student from
    # Score 0.223 / Success 8% / Pass(>0) 50% to 0.180 / 0% / 42% (12 eval items).
    m0 = {"score": 0.223, "success": 1 / 12, "pass_gt0": 0.5, "items": 12.0}
    m1 = {"score": 0.180, "success": 0.0, "pass_gt0": 5 / 12, "items": 12.0}
    run = make_run(
        "sw-opd",
        config=_sciworld(SW_OPD, optim={"lr": 1e-4, "max_steps": 40}, eval={"items": 12}),
        metrics=[eval_rows("sciworld", 0, m0), eval_rows("sciworld", 40, m1)],
    )
    [f] = eval_regression(load_run("sw-opd"))
    # 0.043 at 12 items is inside two standard errors (0.16 each): noted, not an alarm.
    assert f.name == "eval_regression:sciworld" and f.severity is Severity.INFO
    assert "score fell from 0.223 to 0.18" in f.title and "within 2 standard errors" in f.title
    texts = [e.text() for e in f.evidence]
    assert "eval/sciworld/success = 0.0833 -> 0 (steps 0-40)" in texts
    assert any(t.startswith("standard error of the change") and "12 items" in t for t in texts)
    # Noise is not a reason to change the lr: more of the domain's 40 eval items tell 0.04 apart.
    assert [x.override for x in f.fixes] == ["eval.items=40"]
    _accepted(run, f.fixes)
    # A collapse to 0.03 on all 40 items is beyond the noise: an error with the lr fix
    # (forward_kl_topk reads no advantage_clip).
    m0, m1 = {**m0, "items": 40.0}, {**m1, "score": 0.03, "items": 40.0}
    run = make_run(
        "sw-opd-40",
        config=_sciworld(SW_OPD, optim={"lr": 1e-4, "max_steps": 40}, eval={"items": 40}),
        metrics=[eval_rows("sciworld", 0, m0), eval_rows("sciworld", 40, m1)],
    )
    [f] = eval_regression(load_run("sw-opd-40"))
    assert f.severity is Severity.ERROR and [x.override for x in f.fixes] == ["optim.lr=3.3e-05"]
    _accepted(run, f.fixes)


def test_teacher_gap_reads_the_episode_score(make_run: MakeRun) -> None:
    scores = {
        "student_before": {"score": 0.223, "success": 0.083},
        "student_after": {"score": 0.24, "success": 0.083},
        "teacher_score": {"score": 0.786, "success": 0.45},
    }
    make_run("sw-gap", config=_sciworld(SW_OPD, optim={"max_steps": 40}), summary=scores)
    [f] = teacher_gap(load_run("sw-gap"))
    assert "closed 3.0% of the gap" in f.title and "(0.223 -> 0.24; teacher 0.786)" in f.title
    assert [e.source for e in f.evidence][0] == "summary.json student_before.score"


def test_sciworld_rose_budget_fixes_are_knobs_it_reads(make_run: MakeRun) -> None:
    """On an episodic domain every budget is per turn (rollout.max_new_tokens for the student's,
    method.teacher_max_tokens for ROSE's teacher turns); K (method.prefix_tokens) is refused."""
    from distill.diagnose import diagnose

    metrics = series_rows(
        20,
        train__ce_loss=lambda s: 1.0 - 0.01 * s,
        teacher__truncation_rate=lambda s: 0.9,
        teacher__ce_target_share=lambda s: 0.97,
        teacher__ce_target_tokens_max=lambda s: 64.0,
        coverage__supervised_share=lambda s: 0.05,
        student__completion_tokens_mean=lambda s: 900.0,
        student__truncation_rate=lambda s: 0.6,
        student__completion_tokens_max=lambda s: 64.0,
    )
    rose = {"name": "rose", "student_turns": 2, "teacher_max_tokens": 64}
    run = make_run("sw-rose", config=_sciworld(rose), metrics=metrics)
    findings = diagnose(load_run("sw-rose"))
    fixes = [x for f in findings for x in f.fixes]
    keys = {x.key for x in fixes}
    assert {"method.teacher_max_tokens", "rollout.max_new_tokens"} <= keys
    assert "method.prefix_tokens" not in keys
    assert any(f.title.startswith("truncation high in student turns") for f in findings)
    _accepted(run, fixes)


def test_divergence_within_noise_is_quiet_and_a_real_one_fires(make_run: MakeRun) -> None:
    # 200 items x 4 samples: the avg@4 change has a standard error of ~0.023; -0.001 is noise,
    # and pass@4 +0.001 is not even one more item (1/200).
    noise0 = {"avg@4": 0.301, "pass@4": 0.600, "items": 200.0}
    noise1 = {"avg@4": 0.300, "pass@4": 0.601, "items": 200.0}
    make_run("noise", metrics=[eval_rows("rlve", 0, noise0), eval_rows("rlve", 50, noise1)])
    assert eval_divergence(load_run("noise")) == []
    real0 = {"avg@8": 0.30, "pass@8": 0.60, "items": 200.0}
    real1 = {"avg@8": 0.22, "pass@8": 0.65, "items": 200.0}
    make_run("real", metrics=[eval_rows("rlve", 0, real0), eval_rows("rlve", 50, real1)])
    [f] = eval_divergence(load_run("real"))
    se = next(e for e in f.evidence if e.source == "standard error of the avg change")
    assert se.value == pytest.approx((2 * 0.26 * 0.74 / 1600) ** 0.5) and "200 items x 8 samples" in se.note


def test_coverage_names_the_drawn_k_the_run_logged(make_run: MakeRun) -> None:
    """K drawn from [0, 64] per sample: the window CE lands on starts at the logged mean K (17),
    not at the configured top of the range (64)."""
    from distill.diagnose.rules import coverage

    metrics = series_rows(
        10,
        coverage__supervised_share=lambda s: 0.08,
        student__prefix_tokens_mean=lambda s: 17.0,
        student__completion_tokens_mean=lambda s: 800.0,
    )
    rose = {"name": "rose", "prefix_tokens": 64, "prefix_tokens_min": 0, "teacher_max_tokens": 64}
    make_run("drawn", method=rose, metrics=metrics)
    [f] = coverage(load_run("drawn"))
    assert "CE lands only on tokens 17-81 of" in f.why
    assert any(e.source == "K" and e.value == 17.0 for e in f.evidence)
