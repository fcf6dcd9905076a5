"""The signal rules: top-k mass collapse, a saturated advantage clamp, a scoring engine that
disagrees with its reference pass, and out-of-vocabulary samples. Each fires on its pathology
with its numbers and stays quiet on the healthy shape of the same metric."""

from __future__ import annotations

import pytest

from distill.diagnose import Severity, diagnose, load_run
from distill.diagnose.signals import clamp_share, out_of_vocab, reference_gap, topk_mass

from .conftest import MakeRun
from .fake_runs import HEALTHY_CONFIG, healthy_metrics, series_rows

TOPK = {"method.loss": "forward_kl_topk", "optim.lr": 1e-3}


def test_topk_mass_collapse_warns_then_errors(make_run: MakeRun) -> None:
    # verl's top-k reverse-KL shape: the student's mass on the teacher's k tokens drains away.
    make_run(
        "drain",
        config=TOPK,
        metrics=series_rows(
            40,
            kl__student_topk_mass=lambda s: 0.8 * (0.93**s),
            kl__teacher_topk_mass=lambda s: 0.9,
            kl__topk_overlap=lambda s: 0.6 - 0.01 * s,
        ),
    )
    [f] = topk_mass(load_run("drain"))
    assert f.name == "topk_mass_collapse" and f.severity is Severity.ERROR
    values = {e.source: e.value for e in f.evidence}
    assert values["kl/teacher_topk_mass"] == "0.9 -> 0.9"
    assert [x.override for x in f.fixes] == ["optim.lr=0.00033"]
    # A third of the share lost (not half): no finding; half lost: a warning.
    make_run("dip", config=TOPK, metrics=series_rows(40, kl__student_topk_mass=lambda s: 0.8 - 0.008 * s))
    assert topk_mass(load_run("dip")) == []
    make_run(
        "half",
        config={**TOPK, "method.topk_tail": False},
        metrics=series_rows(40, kl__student_topk_mass=lambda s: 0.8 if s <= 8 else 0.35),
    )
    [f] = topk_mass(load_run("half"))
    assert f.severity is Severity.WARNING
    assert f.fixes[0].override == "method.topk_tail=true"


def test_topk_mass_collapse_in_the_first_update(make_run: MakeRun) -> None:
    # The zoo at lr 0.1 (benchmarks/diagnose_precision.py): 0.96 at step 1, ~0.2-0.45 after; the
    # first 20% window's mean already holds the collapse, the first step does not.
    make_run(
        "abrupt",
        config=TOPK,
        metrics=series_rows(
            30,
            kl__student_topk_mass=lambda s: 0.96 if s == 1 else 0.2 + 0.2 * (s % 2),
            kl__teacher_topk_mass=lambda s: 0.98,
        ),
    )
    [f] = topk_mass(load_run("abrupt"))
    assert f.severity is Severity.WARNING and "98.0% -> " in f.title
    # A student that starts low and climbs toward its teacher (the preset at temperature 3): quiet.
    make_run(
        "climb",
        config=TOPK,
        metrics=series_rows(
            30,
            kl__student_topk_mass=lambda s: 0.175 if s == 1 else 0.95,
            kl__teacher_topk_mass=lambda s: 0.97,
        ),
    )
    assert topk_mass(load_run("climb")) == []


def test_topk_steps_that_scored_nothing_are_no_collapse(make_run: MakeRun) -> None:
    # Every sample of an odd step masked out (seam failures): both masses are logged as 0.
    make_run(
        "empty",
        config=TOPK,
        metrics=series_rows(
            30,
            kl__student_topk_mass=lambda s: 0.0 if s % 2 == 0 else 0.95,
            kl__teacher_topk_mass=lambda s: 0.0 if s % 2 == 0 else 0.99,
        ),
    )
    assert topk_mass(load_run("empty")) == []


def test_topk_mass_rising_toward_the_teacher_is_quiet(make_run: MakeRun) -> None:
    make_run(
        "learn",
        config=TOPK,
        metrics=series_rows(
            40, kl__student_topk_mass=lambda s: 0.4 + 0.01 * s, kl__teacher_topk_mass=lambda s: 0.95
        ),
    )
    assert topk_mass(load_run("learn")) == []


def test_clamp_binding_on_most_tokens(make_run: MakeRun) -> None:
    make_run(
        "clamp",
        config={"method.advantage_clip": 0.01, "method.loss": "token_reward_direct"},
        metrics=series_rows(30, kl__clip_share=lambda s: 0.96, kl__reverse_kl_std=lambda s: 0.5),
    )
    [f] = clamp_share(load_run("clamp"))
    assert f.name == "clamp_saturated" and f.severity is Severity.ERROR
    assert "96.0%" in f.title and "advantage_clip=0.01" in f.title
    # 3 x the per-token spread (1.5) beats 4 x the clip (0.04).
    assert [x.override for x in f.fixes] == ["method.advantage_clip=1.5", "method.advantage_clip=null"]
    make_run(
        "mid", config={"method.advantage_clip": 1.0}, metrics=series_rows(30, kl__clip_share=lambda s: 0.6)
    )
    [f] = clamp_share(load_run("mid"))
    assert f.severity is Severity.WARNING
    make_run(
        "rare", config={"method.advantage_clip": 5.0}, metrics=series_rows(30, kl__clip_share=lambda s: 0.02)
    )
    assert clamp_share(load_run("rare")) == []


def test_reference_gap_tiers_and_preflight(make_run: MakeRun) -> None:
    def gap(value: float) -> list[dict]:
        return [
            {"step": 0, "teacher/reference_gap": value},
            *series_rows(3, kl__reverse_kl_mean=lambda s: 0.4),
        ]

    make_run("bf16", config={"teacher.engine": "hf"}, metrics=gap(0.3))
    assert reference_gap(load_run("bf16")) == []  # precision, not a different model
    make_run("off", metrics=gap(1.7))
    [f] = reference_gap(load_run("off"))
    assert f.severity is Severity.WARNING and "1.7 nats" in f.title
    assert {e.source: e.value for e in f.evidence}["kl/reverse_kl_mean"] == pytest.approx(0.4)
    make_run(
        "other",
        metrics=gap(9.2),
        preflight={"checks": {"teacher_reference": {"ok": False, "detail": "max gap 9.2 at token 3"}}},
    )
    found = diagnose(load_run("other"))
    [f] = [x for x in found if x.name == "teacher_reference_gap"]
    assert f.severity is Severity.ERROR
    assert "preflight_failed" not in [x.name for x in found]  # reported once, with its number
    make_run("only-check", preflight={"checks": {"teacher_reference": {"ok": False, "detail": "differs"}}})
    [f] = reference_gap(load_run("only-check"))
    assert f.severity is Severity.WARNING and "preflight" in f.title


def test_out_of_vocab_tiers(make_run: MakeRun) -> None:
    make_run("none", metrics=series_rows(20, student__out_of_vocab_rate=lambda s: 0.0))
    assert out_of_vocab(load_run("none")) == []
    make_run("rare", metrics=series_rows(20, student__out_of_vocab_rate=lambda s: 1e-4 if s == 7 else 0.0))
    [f] = out_of_vocab(load_run("rare"))
    assert f.severity is Severity.INFO and f.fixes == []
    make_run("many", metrics=series_rows(20, student__out_of_vocab_rate=lambda s: 0.03))
    [f] = out_of_vocab(load_run("many"))
    assert f.severity is Severity.ERROR and "3.0%" in f.title
    assert [x.override for x in f.fixes] == ["rollout.top_p=0.99"]


def test_healthy_run_with_every_signal_logged_is_quiet(make_run: MakeRun) -> None:
    metrics = healthy_metrics()
    for row in metrics:
        if "train/loss" in row:
            row.update(
                {
                    "kl/student_topk_mass": 0.7 + 0.002 * row["step"],
                    "kl/teacher_topk_mass": 0.93,
                    "kl/clip_share": 0.03,
                    "student/out_of_vocab_rate": 0.0,
                }
            )
    metrics.insert(0, {"step": 0, "teacher/reference_gap": 2e-6})
    make_run(
        "all",
        config={**HEALTHY_CONFIG, "method.advantage_clip": 5.0},
        metrics=metrics,
        preflight={"checks": {"teacher_reference": {"ok": True, "detail": "max gap 2e-06"}}},
    )
    found = diagnose(load_run("all"))
    assert [f.title for f in found if f.severity >= Severity.WARNING] == []
