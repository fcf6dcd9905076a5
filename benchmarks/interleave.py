"""Side-by-side step timing in one process: each system runs its own real training loop in a
thread, and a baton lets exactly one of them run at a time, one step per turn, round robin. So
every system sees the same machine load at nearly the same moment (the machines here are noisy:
load 3-6), and each one's loop stays its own (distill's `execute`, TRL's `train()`, a plain loop).

Inside a step, `Phases` charges wall time to the innermost open region (generation, teacher,
student, optimizer); time in no region is `other`: for distill, its own overhead around the math
(logging, samples, checks), for TRL its trainer's bookkeeping. Regions come from wrapping
methods (`wrap`) or explicit `region(...)` blocks; the current thread's `Phases` is found
through a thread-local, so a class-level wrapper serves every system.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PHASES = ("generation", "teacher", "student", "optimizer", "other")
_local = threading.local()


class Phases:
    """Exclusive wall time per region for the steps of one system (its own thread)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.acc: dict[str, float] = defaultdict(float)
        self.tokens = 0
        self.mark = time.perf_counter()

    def _charge(self) -> None:
        now = time.perf_counter()
        self.acc[self.stack[-1] if self.stack else "other"] += now - self.mark
        self.mark = now

    def push(self, key: str) -> None:
        self._charge()
        self.stack.append(key)

    def pop(self) -> None:
        self._charge()
        self.stack.pop()

    def restart(self) -> None:
        self.acc.clear()
        self.tokens = 0
        self.mark = time.perf_counter()

    def take(self) -> dict[str, float]:
        self._charge()
        out = {k: self.acc.get(k, 0.0) for k in PHASES}
        out["total"] = sum(out.values())
        out["tokens"] = float(self.tokens)
        self.restart()
        return out


def current() -> Phases | None:
    return getattr(_local, "phases", None)


@contextmanager
def region(key: str) -> Iterator[None]:
    phases = current()
    if phases is None:
        yield
        return
    phases.push(key)
    try:
        yield
    finally:
        phases.pop()


def wrap(owner: Any, name: str, key: str | Callable[..., str]) -> None:
    """Charge calls of `owner.name` to region `key` (or key(*args) when callable) in the calling
    thread's Phases; a thread without one is untouched."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        with region(key(*args, **kwargs) if callable(key) else key):
            return original(*args, **kwargs)

    setattr(owner, name, timed)


def count_tokens(owner: Any, name: str, completions_at: int) -> None:
    """Add the completion tokens `owner.name` returns (at position `completions_at` of its tuple)
    to the calling thread's step."""
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        phases = current()
        if phases is not None:
            phases.tokens += sum(len(row) for row in out[completions_at])
        return out

    setattr(owner, name, counted)


class Baton:
    """Round-robin turns between named systems, one step per turn."""

    def __init__(self, names: list[str]) -> None:
        self.cond = threading.Condition()
        self.order = list(names)
        self.turn = self.order[0] if self.order else None
        self.steps: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        self.started: dict[str, bool] = {n: False for n in names}
        self.errors: dict[str, BaseException] = {}
        # (system, warm-up steps, cProfile.Profile): profile that system's steps after warm-up.
        self.profile: tuple[str, int, Any] | None = None

    def _pass_on(self, name: str) -> None:
        self.turn = self.order[(self.order.index(name) + 1) % len(self.order)]
        self.cond.notify_all()

    def enter(self, name: str) -> None:
        """Start of a system's thread: wait for its first turn (setup runs in turn too)."""
        _local.phases = Phases()
        with self.cond:
            self.cond.wait_for(lambda: self.turn == name)

    def boundary(self, name: str) -> None:
        """Between two steps: record the one that ended, give the machine to the next system."""
        phases = current()
        assert phases is not None
        with self.cond:
            if self.started[name]:
                self.steps[name].append(phases.take())
            self.started[name] = True
            profiler = self._profiler(name)
            if profiler is not None:
                profiler.disable()  # off while the others run
            self._pass_on(name)
            self.cond.wait_for(lambda: self.turn == name)
        if profiler is not None and self.profile is not None and len(self.steps[name]) >= self.profile[1]:
            profiler.enable()  # this thread only, for the step about to start
        phases.restart()

    def _profiler(self, name: str) -> Any:
        return self.profile[2] if self.profile is not None and self.profile[0] == name else None

    def finish(self, name: str, error: BaseException | None = None) -> None:
        """A system's loop ended: its last step is recorded, it leaves the rotation, and it waits
        until every system has finished (so its post-training work overlaps no one's steps)."""
        phases = current()
        with self.cond:
            if name not in self.order:
                return
            if error is not None:
                self.errors[name] = error
            elif self.started[name] and phases is not None:
                self.steps[name].append(phases.take())
            if (profiler := self._profiler(name)) is not None:
                profiler.disable()
            nxt = self.order.index(name)
            self.order.remove(name)
            self.turn = self.order[nxt % len(self.order)] if self.order else None
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.order)

    def run(self, name: str, body: Callable[[], Any]) -> threading.Thread:
        def target() -> None:
            self.enter(name)
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - reported with the table
                self.finish(name, exc)
                return
            self.finish(name)

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread


def trainer_callback(baton: Baton, name: str) -> Any:
    """A transformers TrainerCallback that takes turns at step boundaries."""
    from transformers import TrainerCallback

    class TakeTurns(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            baton.boundary(name)

    return TakeTurns()


def medians(steps: list[dict[str, float]], warmup: int, drop_last: int = 1) -> dict[str, float]:
    """Medians over the steps after warm-up (the last is dropped: it carries a loop's save/teardown)."""
    kept = steps[warmup : len(steps) - drop_last if drop_last else None]
    if not kept:
        return {}
    out = {k: statistics.median(s[k] for s in kept) for k in kept[0]}
    out["n"] = float(len(kept))
    return out
