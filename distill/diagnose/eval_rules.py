"""Rules over the eval record: avg@k falling while pass@k rises, the student made worse than where
it started, and a student that closed little of the gap to its teacher.

Every domain's evals speak one vocabulary (DESIGN.md), but the headline differs: single-turn
domains log `accuracy` (= avg@k), multi-turn ones (SciWorld) log `score` with `success` and
`pass_gt0`. A rule reads the headline the run has, and judges a change against the noise of
the eval that measured it: a change smaller than one standard error of itself is not a finding.
"""

from __future__ import annotations

import math
from typing import Any

from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, pct
from distill.diagnose.records import EvalFile, RunRecord, Series
from distill.diagnose.rules import teacher_budget

SHOWN_ITEMS = 5
# The headline of an eval, in order of preference: single-turn accuracy, else the episode score.
HEADLINES = ("accuracy", "score")
# Shown beside a score headline: the episode domains' other two figures.
COMPANIONS = ("success", "pass_gt0")
# A fall this large (absolute, or relative to where the student started) is a regression.
REGRESSION_WARN, REGRESSION_REL, REGRESSION_ERROR = 0.05, 0.15, 0.15
# A regression must clear this many standard errors of its own change to be a warning.
NOISE_SE = 2.0


def headline(rec: RunRecord, bench: str) -> Series | None:
    """The eval's headline curve: `accuracy` where logged (single-turn), else `score` (episodes)."""
    for name in HEADLINES:
        s = rec.get(f"eval/{bench}/{name}")
        if s is not None:
            return s
    return None


def eval_items(rec: RunRecord, bench: str, step: int | None = None) -> int | None:
    """How many items the eval scored: its logged `items`, else its eval file's rows, else the config."""
    logged = rec.get(f"eval/{bench}/items")
    if logged is not None:
        return int(logged.last())
    file = rec.eval_file(step) if step is not None else None
    if file is not None and file.rows:
        return len(file.rows)
    items = rec.cfg("eval.items")
    return int(items) if isinstance(items, int | float) else None


def _item_value(row: dict[str, Any]) -> float | None:
    """One eval row's value on the headline's scale: an episode's reward, else correct / k."""
    if isinstance(row.get("reward"), int | float):
        return float(row["reward"])
    k = row.get("k")
    if isinstance(row.get("correct"), int | float) and isinstance(k, int | float) and k > 0:
        return float(row["correct"]) / float(k)
    return None


def change_se(
    rec: RunRecord, first: int, last: int, level: float, n: int | None, k: int = 1
) -> tuple[float, str]:
    """One standard error of a headline's change between two evals, and how it was estimated.

    Paired over the items both eval files hold (the per-item changes' spread / sqrt(items)),
    else the binomial bound for two independent evals of n items x k samples at `level`
    (p(1-p) bounds the variance of any value in [0, 1])."""
    return files_se(rec.eval_file(first), rec.eval_file(last), level, n, k)


def files_se(
    a: EvalFile | None, b: EvalFile | None, level: float, n: int | None, k: int = 1
) -> tuple[float, str]:
    """One standard error of the headline's difference between two eval files (two checkpoints,
    or the teacher's and the student's evals of the same items): paired where both hold items
    of the same ids, else the binomial bound at `level` for n items x k samples."""
    if a is not None and b is not None:
        before = {row.get("id"): _item_value(row) for row in a.rows}
        diffs = []
        for row in b.rows:
            old, new = before.get(row.get("id")), _item_value(row)
            if old is not None and new is not None:
                diffs.append(new - old)
        if len(diffs) >= 2:
            mean = sum(diffs) / len(diffs)
            var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
            return math.sqrt(var / len(diffs)), f"paired over {len(diffs)} items"
    if not n:
        return 0.0, "no item count logged"
    p = min(max(level, 0.0), 1.0)
    per = f"{n} items x {k} samples" if k > 1 else f"{n} items"
    return math.sqrt(2 * p * (1 - p) / (n * k)), f"binomial, {per}"


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
        first, last = int(avg.steps[0]), int(avg.steps[-1])
        n = eval_items(rec, bench, last)
        se, how = change_se(rec, first, last, (a0 + a1) / 2, n, k)
        # The fall must clear the eval's own noise; the rise must be at least one more item hit.
        fell_enough = a0 - a1 > 0 and a0 - a1 >= max(se, 1.0 / ((n or 1) * k) - 1e-12)
        rose_enough = p1 - p0 >= (1.0 / n if n else 0.0) - 1e-9 and p1 > p0
        if not (fell_enough and rose_enough):
            continue
        evidence = [
            Evidence(avg.key, f"{fmt(a0)} -> {fmt(a1)}", f"steps {first} -> {last}", f"{a1 - a0:+.4f}"),
            Evidence(pk.key, f"{fmt(p0)} -> {fmt(p1)}", f"steps {first} -> {last}", f"{p1 - p0:+.4f}"),
            Evidence("standard error of the avg change", se, note=how),
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


def lower_lr(rec: RunRecord) -> list[Fix]:
    lr = rec.cfg("optim.lr")
    if not isinstance(lr, int | float) or lr <= 0:
        return []
    return [
        Fix("optim.lr", f"{lr / 3:.2g}", "smaller steps: the updates move the student away from its teacher")
    ]


def _advantage_clip(rec: RunRecord) -> list[Fix]:
    """`method.advantage_clip` bounds token_reward_direct's advantages; no other loss reads it
    (the sciworld OPD preset trains forward_kl_topk)."""
    if rec.teacher_role != "scores" or rec.cfg("method.advantage_clip") is not None:
        return []
    if rec.cfg("method.loss", "token_reward_direct") != "token_reward_direct":
        return []
    return [Fix("method.advantage_clip", "5", "bound the rare very negative per-token advantages")]


def _more_items(rec: RunRecord, n: int | None, drop: float, se: float) -> list[Fix]:
    """eval.items up to the domain's eval set when the drop is within two standard errors."""
    size = rec.cfg("domain.eval_size")
    if not n or not isinstance(size, int) or n >= size or drop >= 2 * se:
        return []
    return [
        Fix(
            "eval.items",
            str(min(size, 4 * n)),
            f"at {n} items a change of {fmt(drop)} is within two standard errors ({fmt(2 * se)}): confirm it",
        )
    ]


def eval_regression(rec: RunRecord) -> list[Finding]:
    """The eval headline falling below where the student started (collapse, or a harmful update
    direction): accuracy on single-turn domains, the episode score on multi-turn ones."""
    out: list[Finding] = []
    for bench in rec.benches():
        acc = headline(rec, bench)
        if acc is None or len(acc) < 2:
            continue
        a0, worst, last = acc.first(), float(min(acc.values)), acc.last()
        drop = a0 - worst
        if drop < REGRESSION_WARN and not (a0 > 0 and drop >= REGRESSION_REL * a0):
            continue
        severity = Severity.ERROR if a0 - last >= REGRESSION_ERROR else Severity.WARNING
        worst_step = int(acc.steps[list(acc.values).index(worst)])
        name = acc.key.rsplit("/", 1)[-1]
        span = f"steps {int(acc.steps[0])} -> {worst_step} -> {int(acc.steps[-1])}"
        evidence = [Evidence(acc.key, f"{fmt(a0)} -> {fmt(worst)} -> {fmt(last)}", span)]
        for other in COMPANIONS if name == "score" else ():
            s = rec.get(f"eval/{bench}/{other}")
            if s is not None and len(s) >= 2:
                evidence.append(Evidence(s.key, f"{fmt(s.first())} -> {fmt(s.last())}", s.span()))
        n = eval_items(rec, bench, worst_step)
        se, how = change_se(rec, int(acc.steps[0]), worst_step, (a0 + worst) / 2, n)
        evidence.append(Evidence("standard error of the change", se, note=how))
        # A fall within two standard errors of the eval's own noise is noted, not alarmed on: an
        # eval of 40 items moves by 0.05 between two checkpoints of the same ability.
        noise = se > 0 and drop < NOISE_SE * se
        fixes = [*lower_lr(rec), *_advantage_clip(rec)] if not noise else []
        fixes += _more_items(rec, n, drop, se)
        out.append(
            Finding(
                name=f"eval_regression:{bench}",
                severity=Severity.INFO if noise else severity,
                title=f"{bench}: eval {name} fell from {_level(name, a0)} to {_level(name, worst)} (step {worst_step}); "
                f"ends at {_level(name, last)}"
                + (f" (within {NOISE_SE:g} standard errors)" if noise else ""),
                evidence=evidence,
                why="Training made the student worse than where it started: the update direction is harmful "
                "(too large a learning rate for the gradient's noise, or a signal the student cannot use).",
                fixes=fixes,
                advice="compare with a teacher-SFT run of the same budget (distill compare) before tuning further",
            )
        )
    return out


def _level(name: str, value: float) -> str:
    # Accuracy reads as a percentage; an episode score stays on its own 0-1 scale, as printed.
    return pct(value) if name == "accuracy" else fmt(value)


GAP_CLOSED_WARN = 0.25


def summary_headline(*scores: Any) -> str | None:
    """The headline all summary entries share: accuracy, else the episode score."""
    for name in HEADLINES:
        if all(isinstance(s, dict) and name in s for s in scores):
            return name
    return None


def teacher_gap(rec: RunRecord) -> list[Finding]:
    """A finished run that closed little of the student-teacher gap on the eval set."""
    before, after = rec.summary.get("student_before"), rec.summary.get("student_after")
    teacher = rec.summary.get("teacher_score")
    name = summary_headline(before, after, teacher)
    if name is None or not (
        isinstance(before, dict) and isinstance(after, dict) and isinstance(teacher, dict)
    ):
        return []
    try:
        b, a, t = float(before[name]), float(after[name]), float(teacher[name])
    except (KeyError, TypeError, ValueError):
        return []
    gap = t - b
    regressed = a < b - REGRESSION_WARN or (b > 0 and a <= b - REGRESSION_REL * b)
    if gap < 0.1 or a - b >= GAP_CLOSED_WARN * gap or regressed:
        return []  # nothing to close, enough closed, or already reported as a regression
    closed = (a - b) / gap
    fixes: list[Fix] = []
    if rec.teacher_role == "scores":
        fixes.append(Fix("method.name", "sft", "control: teacher-SFT on the same prompts and budget"))
    steps = rec.cfg("optim.max_steps")
    if isinstance(steps, int):
        fixes.append(Fix("optim.max_steps", str(steps * 2), "more updates, if the loss is still falling"))
    return [
        Finding(
            name="teacher_gap",
            severity=Severity.WARNING,
            title=f"the student closed {pct(closed)} of the gap to its teacher ({_level(name, b)} -> "
            f"{_level(name, a)}; teacher {_level(name, t)})",
            evidence=[
                Evidence(f"summary.json student_before.{name}", b),
                Evidence(f"summary.json student_after.{name}", a),
                Evidence(f"summary.json teacher_score.{name}", t),
            ],
            why="The method moved the student little although the teacher is far ahead on the same items: the "
            "signal reaches the student too weakly (learning rate, steps) or is one it cannot use.",
            fixes=fixes,
            advice="put it beside a teacher-SFT run with `distill compare` before tuning",
        )
    ]
