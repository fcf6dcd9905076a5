"""diagnose: rules over a run's logged data -> findings (severity, evidence, fix), reports, plots.

    rec = load_run("20250101-rlve-opd")      # id, unique id prefix or path
    findings = diagnose(rec)                 # ranked, most severe first
    exit_code(findings)                      # 0 info only, 1 warnings, 2 errors, 3 incomplete

Rules are plain functions `RunRecord -> list[Finding]`, listed by `all_rules()` in the order a reader
should meet them when severities tie: broken setup first, then supervision, then dynamics. A rule
that raises does not stop the others: it leaves a `rule_crashed:<rule>` warning, and the exit code
is 3 (the diagnosis is incomplete: that rule might have found an error). A finding that blames a
hyper-parameter is screened against the causes the run's records show (screen.py).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

from distill.diagnose.findings import CRASHED, INCOMPLETE, Evidence, Finding, Fix, Severity, exit_code, rank
from distill.diagnose.records import RunNotReadable, RunRecord, Series, load_run
from distill.diagnose.schedule import within_history
from distill.diagnose.screen import screened

Rule = Callable[[RunRecord], list[Finding]]


def all_rules() -> list[Rule]:
    from distill.diagnose import alignment, causes, domains, dynamics, outcomes, precision, signals, speed
    from distill.diagnose import rules as budget

    return [
        budget.run_status,
        outcomes.pairing,
        causes.teacher_weaker,
        signals.reference_gap,
        precision.precision,
        alignment.alignment,
        signals.out_of_vocab,
        budget.teacher_truncation,
        budget.coverage,
        budget.student_truncation,
        causes.duplicate_rollouts,
        outcomes.eval_divergence,
        outcomes.eval_regression,
        outcomes.kl_rising,
        signals.topk_mass,
        signals.clamp_share,
        outcomes.teacher_gap,
        domains.domain_flat,
        dynamics.plateau,
        outcomes.early_reward,
        speed.teacher_time,
        speed.tracking_time,
        domains.teacher_bottleneck,
    ]


def diagnose(rec: RunRecord, only: list[Rule] | None = None) -> list[Finding]:
    """All findings for a run, most severe first."""
    findings: list[Finding] = []
    for rule in only or all_rules():
        try:
            findings += rule(rec)
        except Exception as exc:  # odd data must not hide the other rules' findings
            findings.append(_crash(rule, exc))
    # A rule that blames a hyper-parameter first rules out the causes the records show (screen.py);
    # whatever a rule wrote, no fix suggests an lr above the run's own highest (schedule.py).
    return rank(within_history(rec, screened(rec, findings)))


def _crash(rule: Rule, exc: Exception) -> Finding:
    """What a rule that raised leaves: a warning, never a silent info (what it would have found
    is unknown, an error included)."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    return Finding(
        name=f"{CRASHED}:{rule.__name__}",
        severity=Severity.WARNING,
        title=f"rule {rule.__name__} crashed: {type(exc).__name__}: {exc}; the diagnosis is incomplete",
        evidence=[Evidence("raised at", f"{Path(where.filename).name}:{where.lineno}")] if where else [],
        why="A record this rule reads has a shape it does not handle, so what it checks was not checked; "
        "the other rules still ran, and the exit code is 3.",
        advice="report it with the run's config.yaml and metrics.jsonl",
    )


__all__ = [
    "Evidence",
    "Finding",
    "Fix",
    "INCOMPLETE",
    "RunNotReadable",
    "RunRecord",
    "Series",
    "Severity",
    "all_rules",
    "diagnose",
    "exit_code",
    "load_run",
    "rank",
]
