"""Findings per domain of a run over several domains (distill/diagnose/domains.py)."""

from __future__ import annotations

from pathlib import Path

from distill.diagnose import domains
from distill.diagnose.records import load_run

from .fake_runs import healthy_metrics, series_rows, write_run

MIX = {"domain.name": "rlve+dapo", "domain.mix": {"rlve": 1, "dapo": 2}}


def _parts(rlve: tuple[float, float], dapo: tuple[float, float]) -> dict[str, object]:
    def section(before: float, after: float) -> dict[str, dict[str, float]]:
        return {"student_before": {"accuracy": before}, "student_after": {"accuracy": after}}

    return {"domain": "rlve+dapo", "parts": {"rlve": section(*rlve), "dapo": section(*dapo)}}


def test_a_domain_that_does_not_move_beside_one_that_does(tmp_path: Path) -> None:
    run = write_run(
        tmp_path, "mix", config=MIX, metrics=healthy_metrics(), summary=_parts((0.3, 0.6), (0.25, 0.25))
    )
    findings = domains.domain_flat(load_run(run))
    assert [f.name for f in findings] == ["domain_flat:dapo"]
    (fix,) = findings[0].fixes
    assert fix.override == "domain.mix.dapo=4"  # twice its share of the prompts
    # Both moving: nothing to say.
    both = write_run(
        tmp_path, "both", config=MIX, metrics=healthy_metrics(), summary=_parts((0.3, 0.6), (0.2, 0.3))
    )
    assert domains.domain_flat(load_run(both)) == []


def test_a_one_domain_run_has_no_domain_findings(tmp_path: Path) -> None:
    run = write_run(tmp_path, "one", metrics=healthy_metrics(), summary={"domain": "rlve"})
    rec = load_run(run)
    assert domains.domain_flat(rec) == [] and domains.teacher_bottleneck(rec) == []


def test_a_teacher_far_slower_than_its_share_of_rows(tmp_path: Path) -> None:
    rows = series_rows(
        20,
        train__loss=lambda s: 1.0,
        perf__teacher_time_s__rlve=lambda s: 4.0,
        perf__teacher_time_s__dapo=lambda s: 0.5,
    )
    run = write_run(tmp_path, "slow", config=MIX, metrics=rows, summary={"domain": "rlve+dapo"})
    findings = domains.teacher_bottleneck(load_run(run))
    assert [f.name for f in findings] == ["teacher_bottleneck:rlve"]  # 89% of the time, a third of the rows
    even = series_rows(20, perf__teacher_time_s__rlve=lambda s: 1.0, perf__teacher_time_s__dapo=lambda s: 2.0)
    run = write_run(tmp_path, "even", config=MIX, metrics=even, summary={"domain": "rlve+dapo"})
    assert domains.teacher_bottleneck(load_run(run)) == []


def test_the_report_names_every_domains_teacher_and_all_rules_include_the_domain_rules(
    tmp_path: Path,
) -> None:
    from distill.diagnose import all_rules, diagnose
    from distill.diagnose.report import Report

    config = {**MIX, "teachers": {"rlve": {"name": "puzzles-8b"}, "dapo": {"name": "math-8b"}}}
    run = write_run(
        tmp_path, "two", config=config, metrics=healthy_metrics(), summary=_parts((0.3, 0.6), (0.25, 0.25))
    )
    rec = load_run(run)
    assert rec.teacher == "rlve=puzzles-8b, dapo=math-8b"
    assert {domains.domain_flat, domains.teacher_bottleneck} <= set(all_rules())
    findings = diagnose(rec)
    assert "domain_flat:dapo" in [f.name for f in findings]  # through diagnose itself, not the rule alone
    assert Report(rec, findings).header()["teacher"] == "rlve=puzzles-8b, dapo=math-8b"
