"""Rules over what the student produced and how the pair was set up: early reward near zero, the
KL to the teacher rising, and student/teacher chat-template or thinking-mode mismatch.

The eval-record rules (divergence, regression, teacher gap) live in eval_rules.py and are
re-exported here, where the rule list (`diagnose.all_rules`) finds them."""

from __future__ import annotations

import math
from typing import Any

from distill.diagnose.eval_rules import eval_divergence, eval_regression, lower_lr, teacher_gap
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, nice_tokens, pct
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


def _failed_checks(node: Any, path: str = "") -> list[str]:
    """Names of preflight checks marked failed (`ok`/`passed` false, or a failing status)."""
    if not isinstance(node, dict):
        return []
    out = []
    if (
        node.get("ok") is False
        or node.get("passed") is False
        or str(node.get("status", "")).lower() in ("fail", "failed", "error")
    ):
        out.append(path or "preflight")
    for key, child in node.items():
        out += _failed_checks(child, f"{path}.{key}" if path else str(key))
    return out


def pairing(rec: RunRecord) -> list[Finding]:
    out: list[Finding] = []
    s_think, t_think = rec.cfg("student.enable_thinking"), rec.cfg("teacher.enable_thinking")
    if s_think != t_think:
        explicit = s_think is not None and t_think is not None
        value = s_think if s_think is not None else t_think
        side = "teacher" if s_think is not None else "student"
        out.append(
            Finding(
                name="thinking_mismatch",
                severity=Severity.ERROR if explicit else Severity.WARNING,
                title=f"thinking mode differs: student {s_think}, teacher {t_think}"
                + ("" if explicit else " (None: the model family's default)"),
                evidence=[
                    Evidence("student.enable_thinking", str(s_think)),
                    Evidence("teacher.enable_thinking", str(t_think)),
                ],
                why="Student and teacher render the chat template differently (one opens a <think> block, the other "
                "does not): the teacher scores or continues text in a format it was not prompted for, so the "
                "signal measures the format gap, not the reasoning.",
                fixes=[Fix(f"{side}.enable_thinking", str(value).lower(), "the same mode on both sides")],
            )
        )
    models = rec.manifest.get("models", {})
    st, te = models.get("student", {}), models.get("teacher", {})
    if st.get("vocab") and te.get("vocab") and st["vocab"] != te["vocab"]:
        # OPD crosses by byte groups (alignment.py judges how fine); OPSD has one model, so a
        # second vocabulary there means the run is not what it claims.
        same_ids = rec.method == "opsd"
        out.append(
            Finding(
                name="cross_family",
                severity=Severity.ERROR if same_ids else Severity.INFO,
                title=f"student and teacher tokenizers differ: vocab {st['vocab']} vs {te['vocab']} ({st.get('class')} / {te.get('class')})",
                evidence=[
                    Evidence("manifest models.student", f"{st.get('class')}, vocab {st['vocab']}"),
                    Evidence("manifest models.teacher", f"{te.get('class')}, vocab {te['vocab']}"),
                ],
                why="OPSD distils a model into itself: the teacher must be the student's own weights."
                if same_ids
                else "Cross-family: the teacher sees the student's text through the tokenizer bridge "
                "(OPD: per byte group, docs/cross_family.md); check its seams.",
                fixes=[],
                advice=""
                if same_ids
                else "run `distill bridge check --student S --teacher T` if no preflight.json",
            )
        )
    elif st.get("class") and te.get("class") and st["class"] != te["class"]:
        out.append(
            Finding(
                "model_class_differs",
                Severity.INFO,
                f"student {st['class']} and teacher {te['class']} share a vocabulary but not an architecture",
                [Evidence("manifest models", f"{st['class']} / {te['class']}")],
                "Usually fine; chat templates may still differ between the two.",
            )
        )
    for check in _failed_checks(rec.preflight or {}):
        out.append(
            Finding(
                "preflight_failed",
                Severity.WARNING,
                f"preflight check failed: {check}",
                [Evidence("preflight.json", check)],
                "The pair was run despite a failing preflight check; its signal may be wrong.",
                advice="read preflight.json for the failing seam or template",
            )
        )
    return out


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
