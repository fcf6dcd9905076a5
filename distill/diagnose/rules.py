"""Rules over token budgets: teacher and student truncation, supervision coverage; and run status.

Each rule takes a RunRecord and returns zero or more findings. A rule that lacks its keys returns
nothing: a method logs only the keys that apply to it (DESIGN.md, "Metric names").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, nearest_pow2, nice_tokens, pct
from distill.diagnose.records import RunRecord, Series

# Thresholds, named so the report and the tests speak the same numbers.
TEACHER_SHARE_ERROR, TEACHER_TRUNC_ERROR = 0.9, 0.5
TEACHER_SHARE_WARN, TEACHER_TRUNC_WARN = 0.75, 0.2
COVERAGE_WARN, COVERAGE_ERROR = 0.25, 0.1
STUDENT_RISE_WARN, STUDENT_END_WARN, STUDENT_END_ERROR = 0.1, 0.2, 0.5


@dataclass
class TeacherBudget:
    truncation: Series | None
    share: Series | None
    tokens_max: Series | None
    key: str
    budget: int | None

    @property
    def saturated(self) -> bool:
        t = self.truncation.mean() if self.truncation else 0.0
        s = self.share.mean() if self.share else 0.0
        return t >= TEACHER_TRUNC_ERROR or s >= TEACHER_SHARE_ERROR

    def target(self) -> int:
        """At least twice what the teacher was seen writing (at the budget, twice the budget)."""
        seen = self.tokens_max.max() if self.tokens_max else float(self.budget or 0)
        return nice_tokens(2 * max(seen, float(self.budget or 0), 1.0))


def episodic(rec: RunRecord) -> bool:
    """Whether the run's domain plays multi-turn episodes (its budgets are then per turn)."""
    from distill import registry

    return rec.domain in registry.DOMAINS and registry.domain_entry(rec.domain).episodic


def unit(rec: RunRecord, single: str = "target") -> str:
    """What one token budget bounds: a turn on an episodic domain, else one response."""
    return "turn" if episodic(rec) else single


def teacher_budget(rec: RunRecord) -> TeacherBudget:
    # ROSE: the teacher's continuation budget is t; teacher-SFT trajectories use the rollout budget.
    writes, continues = rec.teacher_role == "writes", rec.teacher_role == "continues"
    if writes or (rec.cfg("method.teacher_max_tokens") is None and not continues):
        key = "rollout.max_new_tokens"
    else:
        key = "method.teacher_max_tokens"
    budget = rec.cfg(key)
    return TeacherBudget(
        truncation=rec.get("teacher/truncation_rate"),
        share=rec.get("teacher/ce_target_share"),
        tokens_max=rec.get("teacher/ce_target_tokens_max"),
        key=key,
        budget=int(budget) if isinstance(budget, int | float) else None,
    )


def teacher_truncation(rec: RunRecord) -> list[Finding]:
    tb = teacher_budget(rec)
    if tb.truncation is None and tb.share is None:
        return []
    trunc = tb.truncation.mean() if tb.truncation else math.nan
    share = tb.share.mean() if tb.share else math.nan
    if share >= TEACHER_SHARE_ERROR or trunc >= TEACHER_TRUNC_ERROR:
        severity = Severity.ERROR
    elif share >= TEACHER_SHARE_WARN or trunc >= TEACHER_TRUNC_WARN:
        severity = Severity.WARNING
    else:
        return []
    evidence = []
    if tb.truncation:
        evidence.append(
            Evidence(
                "teacher/truncation_rate",
                trunc,
                tb.truncation.span(),
                "mean; ended at the budget without EOS",
            )
        )
    if tb.share:
        evidence.append(
            Evidence(
                "teacher/ce_target_share",
                share,
                tb.share.span(),
                f"mean of the budget used; max {pct(tb.share.max())}",
            )
        )
    if tb.tokens_max:
        evidence.append(
            Evidence("teacher/ce_target_tokens_max", tb.tokens_max.max(), tb.tokens_max.span(), "max")
        )
    if tb.budget is not None:
        evidence.append(Evidence(tb.key, tb.budget, note="the teacher's token budget"))
    target = tb.target()
    return [
        Finding(
            name="teacher_truncation",
            severity=severity,
            title=f"teacher continuations cut at the budget: {pct(trunc)} truncated, {pct(share)} of the budget used",
            evidence=evidence,
            why="The teacher almost never finishes on its own, so the student is trained on text that stops "
            "mid-reasoning and never sees how a solution converges to an answer (the reference DAPO-Math ROSE "
            "run: ce_target 960-1016 of 1024 tokens, 94-99% of the budget; avg@16 fell, truncation rose).",
            fixes=[Fix(tb.key, str(target), f"at least 2x the longest teacher {unit(rec)} seen")],
        )
    ]


def drawn_k(rec: RunRecord) -> tuple[float | None, str]:
    """K as the run used it and its source: the logged mean prefix (K is drawn per sample by
    default, and capped at the response), else a fixed configured K; None if neither is known."""
    logged = rec.get("student/prefix_tokens_mean")
    if logged is not None:
        return logged.mean(), f"student/prefix_tokens_mean, mean over {logged.span()}"
    k = rec.cfg("method.prefix_tokens")
    fixed = rec.cfg("method.prefix_tokens_min") is None and rec.cfg("method.prefix_fraction") is None
    if fixed and isinstance(k, int | float):
        return float(k), "method.prefix_tokens (fixed K)"
    return None, ""


def coverage(rec: RunRecord) -> list[Finding]:
    share_s = rec.get("coverage/supervised_share")
    if share_s is None:
        return []
    share = share_s.mean()
    if share >= COVERAGE_WARN:
        return []
    severity = Severity.ERROR if share < COVERAGE_ERROR else Severity.WARNING
    k, t = rec.cfg("method.prefix_tokens"), rec.cfg("method.teacher_max_tokens")
    k_used, k_source = drawn_k(rec)
    chain_s = rec.get("student/completion_tokens_mean")
    chain = chain_s.mean() if chain_s else math.nan
    tb = teacher_budget(rec)
    evidence = [
        Evidence(
            "coverage/supervised_share", share, share_s.span(), "mean: supervised tokens / student chain"
        )
    ]
    if chain_s:
        evidence.append(
            Evidence("student/completion_tokens_mean", chain, chain_s.span(), "the student's real chain")
        )
    for source, value, note in (("K", k_used, k_source), ("method.teacher_max_tokens (t)", t, "")):
        if value is not None:
            evidence.append(Evidence(source, value, note=note))
    fixes: list[Fix] = []
    if tb.saturated:
        fixes.append(
            Fix("method.teacher_max_tokens", str(tb.target()), "the teacher is truncated: raise t first")
        )
    # K is a single-turn knob: an episodic domain refuses it (its ROSE split is student_turns).
    if math.isfinite(chain) and not episodic(rec):
        k_now = int(k) if isinstance(k, int | float) else 0
        k_target = max(nice_tokens(2 * k_now) if k_now else 0, nearest_pow2(chain / 4))
        if k_target < chain and k_target > k_now:
            fixes.append(
                Fix(
                    "method.prefix_tokens",
                    str(k_target),
                    f"move the cut point toward the student's {fmt(chain)}-token chain (1/4-1/2 of it)",
                )
            )
    where = "a window"
    if k_used is not None and isinstance(t, int | float):
        where = f"tokens {fmt(k_used)}-{fmt(k_used + t)}"
    return [
        Finding(
            name="supervision_coverage",
            severity=severity,
            title=f"supervision covers {pct(share)} of the student's chain",
            evidence=evidence,
            why=f"CE lands only on {where} of a ~{fmt(chain)}-token chain: the student is taught to keep writing "
            "mid-chain, never how to converge to an answer (reference: tokens 1024-2048 of 16-18.6k, ~6%).",
            fixes=fixes,
            advice=""
            if fixes
            else f"raise {'method.student_turns' if episodic(rec) else 'method.prefix_tokens (K)'} toward the chain",
        )
    ]


def _truncation_finding(
    name: str, where: str, s: Series, budget_key: str, budget: int | None, longest: float, related: str
) -> Finding | None:
    head, tail = s.window(last=False, min_points=1), s.window(last=True, min_points=1)
    start, end = head.mean(), tail.mean()
    slope = s.slope()
    rise = slope * float(s.steps[-1] - s.steps[0]) if len(s) > 1 else 0.0
    if rise < STUDENT_RISE_WARN and end < STUDENT_END_WARN:
        return None
    severity = Severity.ERROR if end >= STUDENT_END_ERROR else Severity.WARNING
    evidence = [
        Evidence(s.key, start, head.span(), "start"),
        Evidence(s.key, end, tail.span(), "end"),
        Evidence("trend", f"{slope:+.2e}/step, fitted rise {rise:+.2f}" if slope else "flat", s.span()),
    ]
    if budget is not None:
        evidence.append(Evidence(budget_key, budget, note="the token budget"))
    target = nice_tokens(2 * max(longest if math.isfinite(longest) else 0.0, float(budget or 0), 1.0))
    why = (
        f"{where[0].upper()}{where[1:]} end at the token budget without EOS: the score measures the budget, not the ability, "
        "and truncated samples carry no answer."
    )
    if rise >= STUDENT_RISE_WARN:
        why += " The rate rises during training: the student is learning to write longer."
    return Finding(
        name=name,
        severity=severity,
        title=f"truncation {'rising' if rise >= STUDENT_RISE_WARN else 'high'} in {where}: {pct(start)} -> {pct(end)}",
        evidence=evidence,
        why=why + related,
        fixes=[Fix(budget_key, str(target), "2x the longest response seen")],
    )


def student_truncation(rec: RunRecord) -> list[Finding]:
    out: list[Finding] = []
    related = ""
    if teacher_budget(rec).saturated:
        related = (
            " The teacher is truncated too: a student imitating a teacher that never ends learns not to end."
        )
    s = rec.get("student/truncation_rate")
    if s is not None:
        longest = rec.get("student/completion_tokens_max")
        f = _truncation_finding(
            "student_truncation",
            f"student {unit(rec, 'rollout')}s",
            s,
            "rollout.max_new_tokens",
            rec.cfg("rollout.max_new_tokens"),
            longest.max() if longest else math.nan,
            related,
        )
        out += [f] if f else []
    for bench in rec.benches():
        s = rec.get(f"eval/{bench}/truncation_rate")
        if s is None:
            continue
        longest = rec.get(f"eval/{bench}/response_tokens_p90")
        f = _truncation_finding(
            f"eval_truncation:{bench}",
            f"eval ({bench}) {unit(rec, 'response')}s",
            s,
            "eval.max_new_tokens",
            rec.cfg("eval.max_new_tokens"),
            longest.max() if longest else math.nan,
            related,
        )
        out += [f] if f else []
    return out


_STATUS_PHRASE = {
    "RUNNING": "is still running",
    "KILLED": "was interrupted",
    "DIED": "died without recording it (process gone)",
}


def run_status(rec: RunRecord) -> list[Finding]:
    from distill.tracking.rundir import live_status

    status = live_status(rec.summary)
    out: list[Finding] = []
    if status == "FAILED":
        out.append(
            Finding(
                "run_failed",
                Severity.ERROR,
                f"the run failed: {rec.summary.get('error', 'unknown error')}",
                [Evidence("summary.json status", status), Evidence("last logged step", rec.train_steps())],
                "Findings below cover only the steps logged before the failure.",
                advice=f"read {rec.run_dir / 'error.log'}; continue with `distill run --resume {rec.name}`",
            )
        )
    elif status in ("KILLED", "RUNNING", "DIED"):
        out.append(
            Finding(
                "run_unfinished",
                Severity.INFO,
                f"the run {_STATUS_PHRASE[status]}: findings cover steps <= {rec.train_steps()}",
                [Evidence("summary.json status", status)],
                "A killed or live run has no final eval; eval-based findings use the last eval logged.",
                advice=f"continue with `distill run --resume {rec.name}`" if status != "RUNNING" else "",
            )
        )
    if not rec.series and status != "FAILED":  # a failed run says why it has none
        out.append(
            Finding(
                "no_metrics",
                Severity.WARNING,
                "no metrics logged (metrics.jsonl missing or empty)",
                [
                    Evidence(
                        "metrics.jsonl", "absent" if not (rec.run_dir / "metrics.jsonl").exists() else "empty"
                    )
                ],
                "Nothing to diagnose from training dynamics.",
                advice="check error.log",
            )
        )
    if rec.problems:
        out.append(
            Finding(
                "unreadable_records",
                Severity.INFO,
                f"{len(rec.problems)} record(s) could not be read",
                [Evidence(p.split(":")[0], p.split(":", 1)[-1].strip()) for p in rec.problems[:5]],
                "Skipped; the rest of the run was diagnosed.",
            )
        )
    return out
