"""Rules learn the schedule: a loss that flattens while the lr decays is not a stall, and no fix
suggests an lr above the highest the run used (the embedded run's false alarm, issue 47)."""

from __future__ import annotations

import math

import pytest

from distill.diagnose import Evidence, Finding, Fix, Severity, diagnose, load_run
from distill.diagnose.dynamics import plateau
from distill.diagnose.precision import precision
from distill.diagnose.schedule import ceiling, configured_lr, schedule, within_history

from .conftest import MakeRun
from .fake_runs import series_rows

STEPS = 200


def _cosine(s: int, peak: float = 1.2e-3) -> float:
    return peak * 0.5 * (1 + math.cos(math.pi * (s - 1) / STEPS))


def _annealing_loss(s: int) -> float:
    # Falls while the lr is high, then settles as the cosine takes the lr to zero (the embedded
    # OPD run's shape: flat from step ~141, where the lr is ~20% of its peak).
    return 0.07 + 0.3 * math.exp(-s / 25)


def test_loss_flat_under_a_decayed_cosine_is_not_a_stall(make_run: MakeRun) -> None:
    rows = series_rows(STEPS, train__loss=_annealing_loss, train__lr=_cosine, train__grad_norm=lambda s: 1.0)
    make_run(
        "cos",
        config={"optim.lr": 1.2e-3, "optim.scheduler": "cosine", "optim.max_steps": STEPS},
        metrics=rows,
    )
    assert plateau(load_run("cos")) == []
    # The same curve at a constant lr is a plateau, and its fixes raise nothing.
    rows = series_rows(STEPS, train__loss=_annealing_loss, train__lr=lambda s: 1.2e-3)
    make_run("flat", config={"optim.lr": 1.2e-3, "optim.max_steps": STEPS}, metrics=rows)
    [f] = plateau(load_run("flat"))
    assert f.severity is Severity.WARNING
    overrides = [x.override for x in f.fixes]
    assert overrides[-1] == "optim.scheduler=cosine" and not any(o.startswith("optim.lr") for o in overrides)


def test_schedule_without_a_logged_lr_comes_from_the_config(make_run: MakeRun) -> None:
    rows = series_rows(STEPS, train__loss=_annealing_loss)
    cfg = {"optim.lr": 1e-3, "optim.scheduler": "cosine", "optim.max_steps": STEPS, "optim.warmup_ratio": 0.1}
    make_run("cfg", config=cfg, metrics=rows)
    rec = load_run("cfg")
    assert configured_lr(rec, 0) == 0.0 and configured_lr(rec, 10) == pytest.approx(5e-4)
    assert configured_lr(rec, 20) == pytest.approx(1e-3)
    sched = schedule(rec)
    assert sched is not None and sched.decays() and sched.fraction_at(STEPS) < 0.01
    assert plateau(rec) == []
    make_run("lin", config={**cfg, "optim.scheduler": "linear", "optim.warmup_ratio": 0.0}, metrics=rows)
    assert configured_lr(load_run("lin"), 100) == pytest.approx(5e-4)


def test_a_plateau_while_the_lr_is_still_high_is_a_stall(make_run: MakeRun) -> None:
    # Flat from step 20 on, where a cosine lr is still ~98% of its peak: the schedule is no excuse.
    rows = series_rows(STEPS, train__loss=lambda s: 0.5 if s > 20 else 2.0 - 0.075 * s, train__lr=_cosine)
    make_run(
        "early",
        config={"optim.lr": 1.2e-3, "optim.scheduler": "cosine", "optim.max_steps": STEPS},
        metrics=rows,
    )
    [f] = plateau(load_run("early"))
    assert "optim.max_steps=21" in [x.override for x in f.fixes]
    assert "optim.scheduler=cosine" not in [x.override for x in f.fixes]


def test_no_fix_suggests_an_lr_above_the_runs_own(make_run: MakeRun) -> None:
    make_run("r", config={"optim.lr": 1e-4}, metrics=series_rows(5, train__lr=lambda s: 1e-4 * (1 - s / 10)))
    rec = load_run("r")
    assert ceiling(rec) == pytest.approx(1e-4)
    finding = Finding(
        "x",
        Severity.WARNING,
        "t",
        [Evidence("a", 1.0)],
        "w",
        fixes=[Fix("optim.lr", "0.0003"), Fix("optim.lr", "3.3e-05"), Fix("optim.max_steps", "9")],
    )
    [kept] = within_history(rec, [finding])
    assert [x.override for x in kept.fixes] == ["optim.lr=3.3e-05", "optim.max_steps=9"]


def test_precision_in_fp32_or_bf16_never_raises_the_lr(make_run: MakeRun) -> None:
    rows = series_rows(20, train__update_ratio=lambda s: 1e-9, train__grad_norm=lambda s: 1.0)
    for name, dtype in (("p32", "fp32"), ("p16", "bf16")):
        make_run(name, config={"student.precision": dtype, "optim.lr": 1e-7}, metrics=rows)
        [f] = precision(load_run(name))
        assert not [x for x in f.fixes if x.key == "optim.lr"], f.fixes
        assert f.advice
    [f] = [x for x in diagnose(load_run("p16")) if x.name == "precision"]
    assert f.severity is Severity.ERROR and [x.override for x in f.fixes] == ["student.precision=fp32"]


@pytest.mark.parametrize(("after", "severity"), [(0.96, Severity.INFO), (0.50, Severity.WARNING)])
def test_a_stall_after_the_student_reached_its_teacher_is_not_a_fault(
    make_run: MakeRun, after: float, severity: Severity
) -> None:
    # The dapo teacher-SFT preset's shape: 13.5% -> 96.0% against a 97.5% teacher, grad_norm down
    # to a tenth of its start while the cosine lr is still high.
    rows = series_rows(
        STEPS,
        train__loss=lambda s: 0.5,
        train__lr=_cosine,
        train__grad_norm=lambda s: 1.0 if s < 100 else 0.1,
    )
    summary = {
        "student_before": {"accuracy": 0.135},
        "student_after": {"accuracy": after},
        "teacher_score": {"accuracy": 0.975},
    }
    make_run(
        "sft",
        config={"optim.lr": 1.8e-3, "optim.scheduler": "cosine", "optim.max_steps": STEPS},
        metrics=rows,
        summary=summary,
    )
    [f] = plateau(load_run("sft"))
    assert f.severity == severity
    assert (f.fixes == []) == (severity == Severity.INFO)
