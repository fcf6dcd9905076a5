"""The causes a run's records show, named before a hyper-parameter is blamed: a teacher weaker
than its student before training, duplicate rollouts, and the screen of the rules that prescribe
a hyper-parameter (eval_regression, kl_rising, ...).

The records are written as a real run writes them (summary.json's `student_before` and
`teacher_score`, `eval/step-0.jsonl` and `eval/teacher/step-0.jsonl` with one row an item,
metrics.jsonl's `eval/<bench>/` and `student/` keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distill.diagnose import Severity, diagnose, load_run
from distill.diagnose.causes import DUPLICATE_WARN, start_note

from .conftest import MakeRun
from .fake_runs import HEALTHY_CONFIG, eval_rows, series_rows

ITEMS = 50


def _scores(solved: int) -> dict[str, float]:
    acc = solved / ITEMS
    return {"accuracy": acc, "avg@1": acc, "pass@1": acc, "solved": float(solved), "items": float(ITEMS)}


def _eval_file(solved: int, offset: int = 0) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """An eval of ITEMS items at k=1, items offset..offset+solved-1 (wrapping) correct."""
    right = {(offset + i) % ITEMS for i in range(solved)}
    rows = [{"id": f"Sorting-{i}", "correct": int(i in right), "k": 1, "truncated": 0} for i in range(ITEMS)]
    return _scores(solved), rows


def _opd_run(
    make_run: MakeRun,
    name: str,
    student0: int,
    teacher0: int | None,
    curve: list[int],
    config: dict[str, Any] | None = None,
) -> Path:
    """An OPD run whose student solved `student0` of 50 before training, its teacher `teacher0`
    (None: not evaluated), and `curve` at the evals after (every 10 steps)."""
    steps = 10 * len(curve)
    metrics: list[dict[str, Any]] = [
        {"step": 0, **{f"eval/rlve/{k}": v for k, v in _scores(student0).items()}}
    ]
    if teacher0 is not None:
        metrics.append({"step": 0, **{f"teacher/eval/rlve/{k}": v for k, v in _scores(teacher0).items()}})
    metrics += series_rows(
        steps,
        train__loss=lambda s: 1.0 - 0.005 * s,
        train__grad_norm=lambda s: 1.0,
        train__lr=lambda s: 1e-3,
        student__truncation_rate=lambda s: 0.0,
        student__duplicate_share=lambda s: 0.2,
    )
    evals = {0: _eval_file(student0)}
    for i, solved in enumerate(curve, 1):
        metrics.append(eval_rows("rlve", 10 * i, {**_scores(solved), "truncation_rate": 0.0}))
        evals[10 * i] = _eval_file(solved)
    summary: dict[str, Any] = {"student_before": _scores(student0), "student_after": _scores(curve[-1])}
    if teacher0 is not None:
        summary["teacher_score"] = _scores(teacher0)
    run = make_run(
        name,
        config={
            **HEALTHY_CONFIG,
            "optim.lr": 1e-3,
            "optim.max_steps": steps,
            "eval.items": ITEMS,
            **(config or {}),
        },
        metrics=metrics,
        summary=summary,
        evals=evals,
        preflight={"checks": {"chat_template": {"ok": True, "detail": "identical"}}},
    )
    if teacher0 is not None:
        meta, rows = _eval_file(teacher0, offset=25)
        folder = run / "eval" / "teacher"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "step-0.jsonl").write_text("\n".join(json.dumps(r) for r in [{"metrics": meta}, *rows]))
    return run


def _by_name(findings: list[Any]) -> dict[str, Any]:
    return {f.name.partition(":")[0]: f for f in findings}


def test_a_teacher_below_its_student_is_the_cause_and_the_regression_defers_to_it(make_run: MakeRun) -> None:
    """The issue's run: teacher 44.5%-like, student 98%-like before training, the student falls.
    teacher_weaker is the error; eval_regression says the teacher explains it, with no lr fix."""
    run = _opd_run(make_run, "weak-teacher", student0=49, teacher0=22, curve=[40, 30, 27])
    found = _by_name(diagnose(load_run(run)))
    weaker = found["teacher_weaker"]
    assert weaker.severity == Severity.ERROR
    assert [f.override for f in weaker.fixes] == ["method.name=sft"]
    assert "teacher.name" in weaker.advice and "98.0%" in weaker.advice
    regression = found["eval_regression"]
    assert regression.severity == Severity.INFO
    assert not [f for f in regression.fixes if f.key == "optim.lr"]
    assert "explained by a teacher weaker than the student" in regression.title
    lines = [e.text() for e in regression.evidence]
    assert any(
        line.startswith("cause: a teacher weaker") and "teacher 44.0% vs student 98.0%" in line
        for line in lines
    )
    assert any(line.startswith("ruled out: a template or thinking mismatch") for line in lines)
    assert any(line.startswith("ruled out: truncation") for line in lines)
    # Said at start, right after the step-0 evals, in one line.
    note = start_note(run)
    assert note is not None and "\n" not in note and "method.name=sft" in note


def test_a_stronger_teacher_is_ruled_out_in_the_regressions_evidence_and_the_lr_fix_stands(
    make_run: MakeRun,
) -> None:
    run = _opd_run(make_run, "strong-teacher", student0=20, teacher0=40, curve=[14, 10, 8])
    found = _by_name(diagnose(load_run(run)))
    assert "teacher_weaker" not in found
    regression = found["eval_regression"]
    assert regression.severity == Severity.ERROR
    assert [f.override for f in regression.fixes if f.key == "optim.lr"] == ["optim.lr=0.00033"]
    lines = [e.text() for e in regression.evidence]
    assert (
        "ruled out: a teacher weaker than the student = teacher 80.0% vs student 40.0% before training"
        in lines
    )
    assert start_note(run) is None


def test_a_teacher_not_evaluated_is_said_not_ruled_out(make_run: MakeRun) -> None:
    run = _opd_run(make_run, "no-teacher-eval", 20, None, [14, 10, 8], {"eval.eval_teacher": False})
    regression = _by_name(diagnose(load_run(run)))["eval_regression"]
    lines = [e.text() for e in regression.evidence]
    assert any(
        "not ruled out: a teacher weaker" in line and "eval.eval_teacher=false" in line for line in lines
    )
    assert regression.severity == Severity.ERROR


def test_a_teacher_behind_within_the_evals_noise_is_info_and_takes_nothing_over(make_run: MakeRun) -> None:
    # 2 items of 50 apart, the two evals disagreeing on half the items: far inside 2 standard errors.
    run = _opd_run(make_run, "close-teacher", student0=30, teacher0=28, curve=[22, 18, 15])
    found = _by_name(diagnose(load_run(run)))
    assert found["teacher_weaker"].severity == Severity.INFO and not found["teacher_weaker"].fixes
    assert found["eval_regression"].severity == Severity.ERROR


def test_teacher_sft_without_the_verified_filter_is_told_to_use_it(make_run: MakeRun) -> None:
    run = _opd_run(
        make_run, "sft-weak", 45, 20, [40, 35, 30], {"method": {"name": "sft", "keep_verified_only": False}}
    )
    weaker = _by_name(diagnose(load_run(run)))["teacher_weaker"]
    assert [f.override for f in weaker.fixes] == ["method.keep_verified_only=true"]


def test_a_weaker_teacher_of_one_domain_in_a_mix_is_named_after_it(make_run: MakeRun) -> None:
    parts = {
        "rlve": {"student_before": _scores(20), "teacher_score": _scores(40)},
        "dapo": {"student_before": _scores(40), "teacher_score": _scores(10)},
    }
    run = make_run(
        "mix",
        config={"eval.items": ITEMS},
        summary={"student_before": _scores(30), "teacher_score": _scores(25), "parts": parts},
    )
    found = {f.name: f for f in diagnose(load_run(run))}
    assert "teacher_weaker:dapo" in found and found["teacher_weaker:dapo"].severity == Severity.ERROR
    assert "teacher_weaker:rlve" not in found and "teacher_weaker" not in found


def _duplicates_run(
    make_run: MakeRun, name: str, share: float, truncation: float = 0.0, **config: Any
) -> Path:
    metrics = series_rows(
        30,
        train__loss=lambda s: 1.0 - 0.01 * s,
        student__duplicate_share=lambda s: share,
        student__truncation_rate=lambda s: truncation,
    )
    return make_run(name, config={"domain.name": "rlve", **config}, metrics=metrics)


def test_near_greedy_sampling_with_four_samples_a_prompt_is_flagged_with_both_fixes(
    make_run: MakeRun,
) -> None:
    # The duplicate-rollouts plant's figure: median 0.73 (docs/diagnose.md).
    run = _duplicates_run(
        make_run, "dups", 0.73, **{"rollout.temperature": 0.01, "rollout.num_generations": 4}
    )
    found = _by_name(diagnose(load_run(run)))["duplicate_rollouts"]
    assert found.severity == Severity.WARNING
    # The rlve OPD preset samples at 0.3; GRPO needs at least two samples a prompt.
    assert [f.override for f in found.fixes] == ["rollout.temperature=0.3", "rollout.num_generations=2"]
    assert any(e.text().startswith("ruled out: truncation") for e in found.evidence)


def test_the_healthy_presets_share_of_duplicates_is_no_finding(make_run: MakeRun) -> None:
    # The rlve OPD preset's full run (temperature 0.3, 2 samples a prompt) logged a median 0.27,
    # 0.34 over its last 20% of steps, at most 0.47 in one step (docs/diagnose.md).
    assert DUPLICATE_WARN > 0.47
    run = _duplicates_run(
        make_run, "healthy", 0.34, **{"rollout.temperature": 0.3, "rollout.num_generations": 2}
    )
    assert "duplicate_rollouts" not in _by_name(diagnose(load_run(run)))


def test_duplicates_of_rollouts_cut_at_the_budget_from_the_start_keep_no_sampling_fix(
    make_run: MakeRun,
) -> None:
    run = _duplicates_run(
        make_run, "cut", 0.7, truncation=1.0, **{"rollout.temperature": 0.3, "rollout.num_generations": 4}
    )
    found = _by_name(diagnose(load_run(run)))["duplicate_rollouts"]
    assert not found.fixes and "student_truncation" in found.advice
    assert any(e.text().startswith("cause: truncation") for e in found.evidence)


def test_a_template_mismatch_takes_a_rising_kl_over(make_run: MakeRun) -> None:
    metrics = series_rows(40, kl__reverse_kl_mean=lambda s: 0.2 + 0.02 * s, train__loss=lambda s: 1.0)
    run = make_run(
        "tmpl",
        config={"optim.lr": 1e-3},
        metrics=metrics,
        preflight={"checks": {"chat_template": {"ok": False, "detail": "prompts differ at token 3"}}},
    )
    found = _by_name(diagnose(load_run(run)))
    assert found["template_mismatch"].severity == Severity.ERROR
    kl = found["kl_rising"]
    assert kl.severity == Severity.INFO and not kl.fixes and "template_mismatch" in kl.title
