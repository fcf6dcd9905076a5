"""Rules over what the student produced and how the pair was set up: eval divergence, early reward
near zero, and student/teacher chat-template or thinking-mode mismatch."""

from __future__ import annotations

import math
from typing import Any

from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, nice_tokens, pct
from distill.diagnose.records import RunRecord
from distill.diagnose.rules import teacher_budget

NEAR_ZERO = 0.02
BOXED = "\\boxed{"
BOXED_DOMAINS = ("rlve", "dapo")
SHOWN_ITEMS = 5


def _k_values(rec: RunRecord, bench: str) -> list[int]:
    ks = set()
    for key in rec.series:
        head, _, tail = key.rpartition("@")
        if head == f"eval/{bench}/pass" and tail.isdigit():
            ks.add(int(tail))
    return sorted(ks)


def _item_changes(rec: RunRecord, first: int, last: int) -> tuple[list[str], list[str]]:
    """Items whose correct count fell / rose between two eval files, as `id: a/k -> b/k`."""
    a, b = rec.eval_file(first), rec.eval_file(last)
    if a is None or b is None:
        return [], []
    before = {row.get("id"): row for row in a.rows}
    fell: list[str] = []
    rose: list[str] = []
    for row in b.rows:
        old = before.get(row.get("id"))
        if old is None:
            continue
        c0, c1, k = int(old.get("correct", 0)), int(row.get("correct", 0)), row.get("k", "?")
        line = f"{row.get('id')}: {c0}/{k} -> {c1}/{k}"
        if c1 < c0:
            fell.append(line)
        elif c1 > c0:
            rose.append(line)
    return fell, rose


def eval_divergence(rec: RunRecord) -> list[Finding]:
    out: list[Finding] = []
    for bench in rec.benches():
        ks = [k for k in _k_values(rec, bench) if k > 1]
        if not ks:
            continue  # with k=1 avg@1 is pass@1: no spread to diverge
        k = ks[-1]
        avg = rec.get(f"eval/{bench}/avg@{k}") or rec.get(f"eval/{bench}/pass@1")
        pk = rec.get(f"eval/{bench}/pass@{k}")
        if avg is None or pk is None or len(avg) < 2 or len(pk) < 2:
            continue
        a0, a1, p0, p1 = avg.first(), avg.last(), pk.first(), pk.last()
        if not (a1 < a0 and p1 > p0):
            continue
        first, last = int(avg.steps[0]), int(avg.steps[-1])
        evidence = [
            Evidence(avg.key, f"{fmt(a0)} -> {fmt(a1)}", f"steps {first} -> {last}", f"{a1 - a0:+.4f}"),
            Evidence(pk.key, f"{fmt(p0)} -> {fmt(p1)}", f"steps {first} -> {last}", f"{p1 - p0:+.4f}"),
        ]
        p1s = rec.get(f"eval/{bench}/pass@1")
        if p1s is not None and len(p1s) >= 2 and avg.key != p1s.key:
            evidence.append(
                Evidence(p1s.key, f"{fmt(p1s.first())} -> {fmt(p1s.last())}", f"steps {first} -> {last}")
            )
        fell, rose = _item_changes(rec, first, last)
        if fell or rose:
            evidence.append(
                Evidence(
                    f"eval/step-{first}.jsonl vs step-{last}.jsonl",
                    f"{len(fell)} problems fell, {len(rose)} rose",
                )
            )
            evidence += [Evidence("fell", line) for line in fell[:SHOWN_ITEMS]]
            evidence += [Evidence("rose", line) for line in rose[:SHOWN_ITEMS]]
        fixes: list[Fix] = []
        tb = teacher_budget(rec)
        if tb.saturated:
            fixes.append(
                Fix(tb.key, str(tb.target()), "the teacher targets are truncated (see teacher_truncation)")
            )
        fixes.append(
            Fix("eval.k", str(2 * k), "confirm with more samples per problem that the drop is not noise")
        )
        out.append(
            Finding(
                name=f"eval_divergence:{bench}",
                severity=Severity.WARNING,
                title=f"{bench}: avg@{k} fell ({fmt(a0)} -> {fmt(a1)}) while pass@{k} rose ({fmt(p0)} -> {fmt(p1)})",
                evidence=evidence,
                why="More problems are hit by luck while the average sample got worse: output variance went up, "
                "ability did not. Not a win (reference DAPO-Math ROSE: pass@16 +1 problem per benchmark, one of "
                "them 0/16 -> 1/16, while avg@16 and pass@1 fell and truncation rose).",
                fixes=fixes,
                advice="check the supervision findings: a student trained on truncated targets rambles more",
            )
        )
    return out


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
        same_ids = rec.method in ("opd", "opsd")
        out.append(
            Finding(
                name="cross_family",
                severity=Severity.ERROR if same_ids else Severity.INFO,
                title=f"student and teacher tokenizers differ: vocab {st['vocab']} vs {te['vocab']} ({st.get('class')} / {te.get('class')})",
                evidence=[
                    Evidence("manifest models.student", f"{st.get('class')}, vocab {st['vocab']}"),
                    Evidence("manifest models.teacher", f"{te.get('class')}, vocab {te['vocab']}"),
                ],
                why="Token-level methods need one vocabulary: the teacher scores the student's token ids."
                if same_ids
                else "Cross-family: prefixes go through the tokenizer bridge; check its seam round-trip.",
                fixes=[Fix("method.name", "rose", "cross-family pairs go through the tokenizer bridge")]
                if same_ids
                else [],
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


REGRESSION_WARN, REGRESSION_ERROR = 0.05, 0.15
KL_RISE = 1.3


def _lower_lr(rec: RunRecord) -> list[Fix]:
    lr = rec.cfg("optim.lr")
    if not isinstance(lr, int | float) or lr <= 0:
        return []
    return [
        Fix("optim.lr", f"{lr / 3:.2g}", "smaller steps: the updates move the student away from its teacher")
    ]


def eval_regression(rec: RunRecord) -> list[Finding]:
    """Eval accuracy falling below where the student started (collapse, or a harmful update direction)."""
    out: list[Finding] = []
    for bench in rec.benches():
        acc = rec.get(f"eval/{bench}/accuracy")
        if acc is None or len(acc) < 2:
            continue
        a0, worst, last = acc.first(), float(min(acc.values)), acc.last()
        if a0 - worst < REGRESSION_WARN:
            continue
        severity = Severity.ERROR if a0 - last >= REGRESSION_ERROR else Severity.WARNING
        worst_step = int(acc.steps[list(acc.values).index(worst)])
        fixes = _lower_lr(rec)
        if rec.method in ("opd", "opsd") and rec.cfg("method.advantage_clip") is None:
            fixes.append(
                Fix("method.advantage_clip", "5", "bound the rare very negative per-token advantages")
            )
        out.append(
            Finding(
                name=f"eval_regression:{bench}",
                severity=severity,
                title=f"{bench}: eval accuracy fell from {pct(a0)} to {pct(worst)} (step {worst_step}); ends at {pct(last)}",
                evidence=[
                    Evidence(
                        acc.key,
                        f"{fmt(a0)} -> {fmt(worst)} -> {fmt(last)}",
                        f"steps {int(acc.steps[0])} -> {worst_step} -> {int(acc.steps[-1])}",
                    )
                ],
                why="Training made the student worse than where it started: the update direction is harmful "
                "(too large a learning rate for the gradient's noise, or a signal the student cannot use).",
                fixes=fixes,
                advice="compare with a teacher-SFT run of the same budget (distill compare) before tuning further",
            )
        )
    return out


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
            fixes=_lower_lr(rec),
        )
    ]


GAP_CLOSED_WARN = 0.25


def teacher_gap(rec: RunRecord) -> list[Finding]:
    """A finished run that closed little of the student-teacher gap on the eval set."""
    before, after = rec.summary.get("student_before"), rec.summary.get("student_after")
    teacher = rec.summary.get("teacher_score")
    if not (isinstance(before, dict) and isinstance(after, dict) and isinstance(teacher, dict)):
        return []
    try:
        b, a, t = float(before["accuracy"]), float(after["accuracy"]), float(teacher["accuracy"])
    except (KeyError, TypeError, ValueError):
        return []
    gap = t - b
    if gap < 0.1 or a - b >= GAP_CLOSED_WARN * gap or a < b - REGRESSION_WARN:
        return []  # nothing to close, enough closed, or already reported as a regression
    closed = (a - b) / gap
    fixes: list[Fix] = []
    if rec.method in ("opd", "opsd"):
        fixes.append(Fix("method.name", "sft", "control: teacher-SFT on the same prompts and budget"))
    steps = rec.cfg("optim.max_steps")
    if isinstance(steps, int):
        fixes.append(Fix("optim.max_steps", str(steps * 2), "more updates, if the loss is still falling"))
    return [
        Finding(
            name="teacher_gap",
            severity=Severity.WARNING,
            title=f"the student closed {pct(closed)} of the gap to its teacher ({pct(b)} -> {pct(a)}; teacher {pct(t)})",
            evidence=[
                Evidence("summary.json student_before.accuracy", b),
                Evidence("summary.json student_after.accuracy", a),
                Evidence("summary.json teacher_score.accuracy", t),
            ],
            why="The method moved the student little although the teacher is far ahead on the same items: the "
            "signal reaches the student too weakly (learning rate, steps) or is one it cannot use.",
            fixes=fixes,
            advice="put it beside a teacher-SFT run with `distill compare` before tuning",
        )
    ]
