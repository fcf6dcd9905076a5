"""Training dynamics: a loss that stopped moving while the lr could still move it, and a
grad_norm collapse.

A loss judged flat changes by less than 2% over the last 20% of the run (a least-squares slope
times the window, relative to its level). Where the lr had decayed below half its peak by the
point the loss went flat (a cosine or linear schedule annealing), the flat loss is the schedule
doing its job, not a stall (schedule.py); the embedded OPD run's loss is flat from step ~141 of
200, where its cosine lr is ~20% of the peak.
"""

from __future__ import annotations

import math

import numpy as np

from distill.diagnose.eval_rules import summary_headline
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, pct
from distill.diagnose.records import RunRecord, Series
from distill.diagnose.schedule import DECAYED, schedule

FLAT_REL_CHANGE = 0.02
GRAD_COLLAPSE_RATIO = 0.1
MIN_TREND_POINTS = 10


def _rel_change(s: Series) -> float:
    level = abs(float(np.nanmean(s.values)))
    span = float(s.steps[-1] - s.steps[0])
    return s.slope() * span / level if level > 0 and span > 0 else 0.0


def flat_since(s: Series) -> int | None:
    """The earliest step from which the rest of the curve changes by less than 2% (None: not flat)."""
    n = len(s)
    for frac in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        tail = Series(s.key, s.steps[int(n * frac) :], s.values[int(n * frac) :])
        if len(tail) >= 3 and abs(_rel_change(tail)) < FLAT_REL_CHANGE:
            return int(tail.steps[0])
    return None


def _schedule_note(rec: RunRecord, start: int) -> Evidence | None:
    """Evidence that the lr had decayed below half its peak where the loss went flat (then the
    flat loss is the schedule's doing), else None."""
    sched = schedule(rec)
    if sched is None or not sched.decays():
        return None
    frac = sched.fraction_at(start)
    if frac >= DECAYED:
        return None
    where = f"{sched.kind} schedule" if sched.kind != "logged" else "train/lr"
    return Evidence(
        "lr where the loss went flat",
        sched.at(start),
        f"step {start}",
        f"{pct(frac)} of the peak {fmt(sched.peak)} ({where})",
    )


def _flat_loss(rec: RunRecord, loss: Series) -> tuple[list[Evidence], int | None, Evidence | None]:
    """(evidence, flat-since step, schedule note) for a loss whose last 20% is flat; ([], None,
    None) when it is still moving."""
    tail = loss.window(0.2, last=True, min_points=5)
    rel = _rel_change(tail)
    if abs(rel) >= FLAT_REL_CHANGE or abs(tail.mean()) <= 1e-3:
        return [], None, None
    since = flat_since(loss)
    evidence = [
        Evidence(
            f"{loss.key} slope",
            f"{tail.slope():+.2e}/step",
            tail.span(),
            f"relative change {rel:+.2%} over the window at level {fmt(tail.mean())}",
        )
    ]
    if since is not None:
        evidence.append(Evidence(f"{loss.key} flat since", f"step {since}", note="< 2% change from there on"))
    note = _schedule_note(rec, since if since is not None else int(tail.steps[0]))
    return evidence, since, note


def _grad_collapse(grad: Series | None) -> list[Evidence]:
    if grad is None or len(grad) < MIN_TREND_POINTS:
        return []
    head, tail = grad.window(0.2, last=False), grad.window(0.2, last=True)
    ratio = tail.median() / head.median() if head.median() > 0 else math.nan
    if not ratio < GRAD_COLLAPSE_RATIO:
        return []
    return [
        Evidence("train/grad_norm", head.median(), head.span(), "median, start"),
        Evidence("train/grad_norm", tail.median(), tail.span(), f"median, end: {pct(ratio)} of start"),
    ]


# A student that ends this close to its teacher (share of the before -> teacher gap) has learned
# what the targets hold: a stall then is the end of the signal, not a fault.
CAUGHT_UP = 0.9


def _caught_up(rec: RunRecord) -> list[Evidence]:
    """The final eval against the teacher's where the student closed CAUGHT_UP of the gap."""
    before, after, teacher = (
        rec.summary.get(k, {}) for k in ("student_before", "student_after", "teacher_score")
    )
    name = summary_headline(before, after, teacher)
    if name is None:
        return []
    b, a, t = float(before[name]), float(after[name]), float(teacher[name])
    if not (t > b and a - b >= CAUGHT_UP * (t - b)):
        return []
    return [
        Evidence(f"summary.json student_after.{name}", a, note=f"{pct((a - b) / (t - b))} of the gap"),
        Evidence(f"summary.json teacher_score.{name}", t),
    ]


def plateau(rec: RunRecord) -> list[Finding]:
    """A loss that stopped moving while the lr could still move it, or a grad_norm collapse.

    A loss that flattens only once the lr has decayed below half its peak (cosine, linear) is the
    schedule annealing, not a stall: no finding. No fix raises the lr (schedule.ceiling)."""
    loss = rec.get("train/ce_loss") or rec.get("train/loss")
    evidence: list[Evidence] = []
    since = None
    flat = False
    if loss is not None and len(loss) >= MIN_TREND_POINTS:
        flat_ev, since, annealed = _flat_loss(rec, loss)
        flat = bool(flat_ev) and annealed is None
        evidence += flat_ev if flat else []
    collapse_ev = _grad_collapse(rec.get("train/grad_norm"))
    evidence += collapse_ev
    if not (flat or collapse_ev):
        return []
    what = " and ".join(w for w, on in (("loss plateau", flat), ("grad_norm collapse", collapse_ev)) if on)
    done = _caught_up(rec)
    if done:
        return [
            Finding(
                name="training_stalled",
                severity=Severity.INFO,
                title=f"training stalled ({what}) once the student had reached its teacher",
                evidence=evidence + done,
                why="The student ends within a tenth of the gap to its teacher: the targets hold little it "
                "has not learned, so the updates shrink. Nothing to fix.",
            )
        ]
    fixes: list[Fix] = []
    if flat and since is not None and since < rec.train_steps():
        fixes.append(Fix("optim.max_steps", str(since), "steps after the plateau bought no training signal"))
    if flat and not collapse_ev and rec.cfg("optim.scheduler", "constant") == "constant":
        fixes.append(
            Fix(
                "optim.scheduler",
                "cosine",
                "at a constant lr the loss settles at the level its update noise allows; a decay to "
                "zero lets the same peak lr finish calm (the rlve OPD preset's schedule)",
            )
        )
    return [
        Finding(
            name="training_stalled",
            severity=Severity.WARNING,
            title=f"training stalled: {what}",
            evidence=evidence,
            why="The optimiser has stopped finding signal in the targets while the lr could still move the "
            "weights. With truncated or narrow supervision this is the student having learned all there is "
            "(reference DAPO-Math ROSE: ce_loss slope -0.00012 from step 31, grad_norm down to 0.18, eval "
            "falling); otherwise updates may be too small.",
            fixes=fixes,
            advice="fix supervision findings (teacher truncation, coverage) first; they change what there is "
            "to learn. No lr above this run's peak is suggested: if eval is flat too, try larger ones in short "
            "runs and put them beside this one (`distill compare`)",
        )
    ]
