"""The learning rate a run trained under, as the rules need it: where it stood at a step
(relative to its peak), and the highest it ever was.

Two sources: the logged `train/lr` (what the optimizer used at each step), else the schedule the
config names (`optim.scheduler`, `optim.warmup_ratio`, `optim.max_steps`), computed as
transformers computes it (methods/callbacks.py hands it these three). A loss that flattens while
the lr decays toward zero is the schedule doing its job, not a stall; and no rule may suggest an
lr above what the run itself used (`ceiling`): a run's own history is the only evidence diagnose
has that an lr trains at all, and a 3x lr on a preset tuned by a sweep is usually worse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from distill.diagnose.findings import Finding, Fix
from distill.diagnose.records import RunRecord

# Below this fraction of its peak the lr has decayed enough that a flat loss is the schedule's.
DECAYED = 0.5


@dataclass(frozen=True)
class Schedule:
    kind: str  # "logged", or the config's scheduler: constant / linear / cosine
    peak: float
    steps: np.ndarray
    lrs: np.ndarray

    def at(self, step: int) -> float:
        """The lr at `step` (linear between known points, held at the ends)."""
        if not self.steps.size:
            return self.peak
        return float(np.interp(step, self.steps, self.lrs))

    def fraction_at(self, step: int) -> float:
        return self.at(step) / self.peak if self.peak > 0 else 1.0

    def decays(self) -> bool:
        """Whether the lr ends well below its peak (a decaying schedule, not a constant one)."""
        return bool(self.lrs.size) and float(self.lrs[-1]) < DECAYED * self.peak


def configured_lr(rec: RunRecord, step: int) -> float | None:
    """The lr transformers' scheduler gives at optimizer step `step` (0-based) for the config."""
    lr, total = rec.cfg("optim.lr"), rec.cfg("optim.max_steps")
    if not isinstance(lr, int | float) or not isinstance(total, int | float) or total <= 0:
        return None
    ratio = rec.cfg("optim.warmup_ratio", 0.0)
    warmup = int((ratio if isinstance(ratio, int | float) else 0.0) * total)
    if step < warmup:
        return float(lr) * step / max(1, warmup)
    kind = rec.cfg("optim.scheduler", "constant")
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "cosine":
        return float(lr) * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    if kind == "linear":
        return float(lr) * max(0.0, 1.0 - progress)
    return float(lr)


def schedule(rec: RunRecord) -> Schedule | None:
    """The run's lr per step: logged if it was, else from the config; None if neither is known."""
    logged = rec.get("train/lr")
    if logged is not None and len(logged):
        return Schedule("logged", logged.max(), logged.steps, logged.values)
    total = rec.cfg("optim.max_steps")
    if configured_lr(rec, 0) is None or not isinstance(total, int | float):
        return None
    # A metrics row of step s logs the lr its update used: the scheduler's value at s - 1.
    steps = np.arange(1, int(total) + 1)
    lrs = np.array([configured_lr(rec, int(s) - 1) or 0.0 for s in steps])
    peak = float(lrs.max()) if lrs.size else 0.0
    return Schedule(str(rec.cfg("optim.scheduler", "constant")), peak, steps, lrs)


def ceiling(rec: RunRecord) -> float | None:
    """The highest lr the run used: the most any rule may suggest."""
    known = [v for v in (rec.cfg("optim.lr"),) if isinstance(v, int | float)]
    sched = schedule(rec)
    if sched is not None:
        known.append(sched.peak)
    return max(known) if known else None


def within_history(rec: RunRecord, findings: list[Finding]) -> list[Finding]:
    """Drops any `optim.lr` fix above the run's own highest lr (whatever rule wrote it)."""
    top = ceiling(rec)
    if top is None:
        return findings
    for f in findings:
        f.fixes = [x for x in f.fixes if not _above(x, top)]
    return findings


def _above(fix: Fix, top: float) -> bool:
    if fix.key != "optim.lr":
        return False
    try:
        return float(fix.value) > top * (1 + 1e-9)
    except ValueError:
        return False
