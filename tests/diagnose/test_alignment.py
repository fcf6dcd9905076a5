"""Alignment rules: a cross-family OPD run whose byte groups are too coarse for a per-token signal,
or whose seam masked many samples out, warns with the numbers and a fix; a fine one is an INFO line;
a same-family run (no alignment figures logged) gets nothing."""

from __future__ import annotations

from distill.diagnose import Severity, diagnose, load_run
from distill.diagnose.alignment import ALIGNED_SHARE_WARN, SEAM_FAILURE_WARN, alignment

from .conftest import MakeRun
from .fake_runs import healthy_metrics, series_rows


def _cross(share: float, seams: float) -> list[dict[str, float]]:
    return series_rows(
        10,
        kl__aligned_share=lambda s: share,
        bridge__seam_failure_rate=lambda s: seams,
        kl__one_to_one_share=lambda s: share - 0.1,
        kl__max_group_student=lambda s: float(s),  # the largest group of the run: 10 at step 10
        kl__supervised_share=lambda s: 0.9,
    )


def test_coarse_alignment_warns_with_the_figures_and_suggests_spread(make_run: MakeRun) -> None:
    make_run("coarse", config={"method.group_advantage": "last"}, metrics=_cross(0.55, 0.0))
    (f,) = alignment(load_run("coarse"))
    assert (f.name, f.severity) == ("alignment_coarse", Severity.WARNING)
    assert "55.0%" in f.title and f"(threshold {ALIGNED_SHARE_WARN:.1%})" in f.title
    evidence = {e.source: e.value for e in f.evidence}
    assert evidence["kl/aligned_share (mean)"] == "55.0%"
    assert evidence["kl/max_group_student (max)"] == 10.0
    assert evidence["kl/one_to_one_share (mean)"] == "45.0%"
    assert [x.override for x in f.fixes] == ["method.group_advantage=spread"]
    assert "--method rose" in f.advice and "bridge check" in f.advice


def test_coarse_alignment_with_spread_already_set_only_advises(make_run: MakeRun) -> None:
    make_run("spread", metrics=_cross(0.5, 0.0))  # group_advantage defaults to spread
    (f,) = alignment(load_run("spread"))
    assert f.name == "alignment_coarse" and f.fixes == []


def test_seam_failures_over_the_threshold_warn(make_run: MakeRun) -> None:
    make_run("seams", metrics=_cross(0.95, 0.2))
    (f,) = alignment(load_run("seams"))
    assert (f.name, f.severity) == ("seam_failures", Severity.WARNING)
    assert "20.0%" in f.title and f"{SEAM_FAILURE_WARN:.1%}" in f.title
    make_run("both", metrics=_cross(0.5, 0.2))
    assert [x.name for x in alignment(load_run("both"))] == ["alignment_coarse", "seam_failures"]


def test_fine_alignment_is_one_info_line(make_run: MakeRun) -> None:
    make_run("fine", metrics=_cross(0.97, 0.01))
    (f,) = alignment(load_run("fine"))
    assert (f.name, f.severity) == ("alignment", Severity.INFO)
    assert "97.0%" in f.title and "1.0%" in f.title
    # The thresholds are inclusive on the healthy side.
    make_run("edge", metrics=_cross(ALIGNED_SHARE_WARN, SEAM_FAILURE_WARN))
    assert [x.severity for x in alignment(load_run("edge"))] == [Severity.INFO]


def test_same_family_runs_get_nothing_and_the_rule_is_registered(make_run: MakeRun) -> None:
    make_run("same", metrics=healthy_metrics())
    assert alignment(load_run("same")) == []
    assert not any(f.name.startswith(("alignment", "seam_failures")) for f in diagnose(load_run("same")))
    make_run("cross", metrics=healthy_metrics() + _cross(0.5, 0.0))
    names = [f.name for f in diagnose(load_run("cross"))]
    assert "alignment_coarse" in names and not any(n.startswith("rule_crashed") for n in names)


def test_a_run_over_several_domains_is_judged_per_domain(make_run: MakeRun) -> None:
    # A mixed run logs the cross-family figures of its crossing teacher per domain only
    # (methods/batch.py `per_part`): dapo's teacher of another family, rlve's of the student's.
    rows = series_rows(
        10,
        kl__dapo__aligned_share=lambda s: 0.5,
        bridge__dapo__seam_failure_rate=lambda s: 0.2,
        kl__dapo__max_group_student=lambda s: float(s),
        kl__reverse_kl_mean=lambda s: 0.3,
    )
    make_run("mix", config={"domain.name": "rlve+dapo"}, metrics=healthy_metrics() + rows)
    found = alignment(load_run("mix"))
    assert [(f.name, f.severity) for f in found] == [
        ("alignment_coarse:dapo", Severity.WARNING),
        ("seam_failures:dapo", Severity.WARNING),
    ]
    assert found[0].title.startswith("dapo: ") and "teachers.dapo.name" in found[0].advice
    evidence = {e.source: e.value for e in found[0].evidence}
    assert evidence["kl/dapo/aligned_share (mean)"] == "50.0%"
    assert evidence["kl/dapo/max_group_student (max)"] == 10.0
    names = [f.name for f in diagnose(load_run("mix"))]
    assert {"alignment_coarse:dapo", "seam_failures:dapo"} <= set(names)
