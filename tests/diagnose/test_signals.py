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
    # Every sample of an even step masked out (seam failures): KLMeter logs no top-k mass for it,
    # only the step's other figures.
    rows = series_rows(30, train__loss=lambda s: 1.0)
    for row in rows:
        if row["step"] % 2:
            row.update({"kl/student_topk_mass": 0.95, "kl/teacher_topk_mass": 0.99})
    make_run("empty", config=TOPK, metrics=rows)
    rec = load_run("empty")
    assert len(rec.get("kl/student_topk_mass") or []) == 15
    assert topk_mass(rec) == []
    # The same gaps around a real collapse still show it.
    for row in rows:
        if row["step"] > 10 and "kl/student_topk_mass" in row:
            row["kl/student_topk_mass"] = 0.1
    make_run("empty-collapse", config=TOPK, metrics=rows)
    [f] = topk_mass(load_run("empty-collapse"))
    assert f.severity is Severity.ERROR


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


def _reference(ok: bool, gap: float | None, detail: str = "") -> dict:
    """`preflight.json` as a run with a served teacher writes it (methods/preflight.py)."""
    entry: dict = {"ok": ok, "detail": detail or f"max |delta logprob| {gap} (served vs in-process)"}
    if gap is not None:
        entry["value"] = gap
    return {"checks": {"teacher_reference": entry}}


def test_reference_gap_tiers_and_preflight(make_run: MakeRun) -> None:
    kl = series_rows(3, kl__reverse_kl_mean=lambda s: 0.4)
    make_run("bf16", config={"teacher.engine": "server"}, metrics=kl, preflight=_reference(True, 0.3))
    assert reference_gap(load_run("bf16")) == []  # precision, not a different model
    make_run("off", metrics=kl, preflight=_reference(False, 1.7))
    [f] = reference_gap(load_run("off"))
    assert f.severity is Severity.WARNING and "1.7 nats" in f.title
    assert {e.source: e.value for e in f.evidence}["kl/reverse_kl_mean"] == pytest.approx(0.4)
    make_run("other", metrics=kl, preflight=_reference(False, 9.2))
    found = diagnose(load_run("other"))
    [f] = [x for x in found if x.name == "teacher_reference_gap"]
    assert f.severity is Severity.ERROR
    assert "preflight_failed" not in [x.name for x in found]  # reported once, with its number
    make_run("only-check", preflight=_reference(False, None, "differs"))
    [f] = reference_gap(load_run("only-check"))
    assert f.severity is Severity.WARNING and "preflight" in f.title
    # A run over several domains keeps each domain's report: the failing one is found.
    make_run(
        "parts",
        config={"domain.name": "rlve+dapo"},
        preflight={
            "parts": {"rlve": _reference(True, 0.01), "dapo": _reference(False, 6.0, "another model")}
        },
    )
    [f] = reference_gap(load_run("parts"))
    assert f.severity is Severity.ERROR
    assert {e.source: e.note for e in f.evidence}["preflight.json teacher_reference"] == "dapo: another model"
    # No check (no served teacher): the rule reads the preflight, never a step metric.
    make_run("no-check", metrics=[{"step": 0, "teacher/reference_gap": 9.0}, *kl])
    assert reference_gap(load_run("no-check")) == []


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
    make_run(
        "all",
        config={**HEALTHY_CONFIG, "method.advantage_clip": 5.0},
        metrics=metrics,
        preflight=_reference(True, 2e-6),
    )
    found = diagnose(load_run("all"))
    assert [f.title for f in found if f.severity >= Severity.WARNING] == []
