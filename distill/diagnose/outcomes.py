"""Rules over what the student produced: early reward near zero and the KL to the teacher rising.

The eval-record rules (divergence, regression, teacher gap) live in eval_rules.py and are
re-exported here, where the rule list (`diagnose.all_rules`) finds them, as are the pairing rules
(pairing.py)."""

from __future__ import annotations

import math

from distill.diagnose.eval_rules import eval_divergence, eval_regression, lower_lr, teacher_gap
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, nice_tokens, pct
from distill.diagnose.pairing import pairing
from distill.diagnose.records import RunRecord

NEAR_ZERO = 0.02
BOXED = "\\boxed{"
BOXED_DOMAINS = ("rlve", "dapo")

__all__ = ["early_reward", "eval_divergence", "eval_regression", "kl_rising", "pairing", "teacher_gap"]


def _boxed_share(rec: RunRecord, first_steps: int) -> tuple[float, int]:
    """Share of early responses (rollout samples, else the first eval) that carry a `\\boxed{` answer."""
    texts = [str(r["student"]) for r in rec.sample_rows(first_steps=first_steps) if "student" in r]
    if not texts:
        steps = rec.eval_steps()
        first = rec.eval_file(steps[0]) if steps else None
        texts = [str(t) for row in (first.rows if first else []) for t in row.get("responses", [])]
    if not texts:
        return math.nan, 0
    return sum(BOXED in t for t in texts) / len(texts), len(texts)


def early_reward(rec: RunRecord) -> list[Finding]:
    s = rec.get("student/accuracy") or rec.get("student/reward_mean")
    if s is None:
        return []
    head = s.window(0.1, last=False, min_points=min(3, len(s)))
    level = head.mean()
    if level > NEAR_ZERO:
        return []
    last_step = int(head.steps[-1])
    evidence = [Evidence(s.key, level, head.span(), "mean over the first steps")]
    teacher = rec.summary.get("teacher_score") or {}
    if "accuracy" in teacher:
        evidence.append(Evidence("teacher eval accuracy", pct(teacher["accuracy"]), "step 0"))
    trunc = rec.get("student/truncation_rate")
    trunc_level = math.nan
    if trunc is not None:
        early = trunc.values[trunc.steps <= last_step]
        trunc_level = float(early.mean()) if early.size else math.nan
        evidence.append(Evidence("student/truncation_rate", trunc_level, head.span()))
    boxed, n = _boxed_share(rec, last_step) if rec.domain in BOXED_DOMAINS else (math.nan, 0)
    if n:
        evidence.append(Evidence("responses with \\boxed{", pct(boxed), note=f"of {n} early samples"))
    fixes: list[Fix] = []
    advice = ""
    if trunc_level >= 0.5:
        cause, severity = "the student runs out of tokens before it can answer", Severity.WARNING
        budget = rec.cfg("rollout.max_new_tokens")
        if isinstance(budget, int | float):
            fixes.append(
                Fix("rollout.max_new_tokens", str(nice_tokens(2 * budget)), "room to reach an answer")
            )
    elif n and boxed < 0.5:
        cause, severity = (
            "the student does not write answers in the required \\boxed{} format",
            Severity.WARNING,
        )
        advice = "warm-start with teacher-SFT (--method sft) so the student learns the answer format"
    else:
        cause, severity = "the student is simply weak at this difficulty", Severity.INFO
        advice = (
            "lower the difficulty (domain.parameters) or start from a stronger student (student.name=...)"
        )
    return [
        Finding(
            name="early_reward_zero",
            severity=severity,
            title=f"reward near zero in the first steps: {cause}",
            evidence=evidence,
            why="With no correct rollouts the run's reward and accuracy curves carry no information early on; "
            "distillation can still move the student, but the cause decides whether it can ever score.",
            fixes=fixes,
            advice=advice,
        )
    ]


KL_RISE = 1.3


def kl_rising(rec: RunRecord) -> list[Finding]:
    """On-policy methods should pull the student toward the teacher: a rising reverse KL says they do not."""
    kl = rec.get("kl/reverse_kl_mean")
    if kl is None or len(kl) < 10:
        return []
    head, tail = kl.window(0.2, last=False), kl.window(0.2, last=True)
    k0, k1 = head.mean(), tail.mean()
    if not (k0 > 0 and k1 >= KL_RISE * k0):
        return []
    return [
        Finding(
            name="kl_rising",
            severity=Severity.WARNING,
            title=f"reverse KL to the teacher rose from {fmt(k0)} to {fmt(k1)} (first vs last 20% of steps)",
            evidence=[
                Evidence(kl.key, f"{fmt(k0)} -> {fmt(k1)}", f"{head.span()} vs {tail.span()}", "window means")
            ],
            why="The objective is the student's reverse KL to the teacher; if it rises, the steps overshoot.",
            fixes=lower_lr(rec),
        )
    ]
