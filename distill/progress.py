"""Progress for long work (zoo builds, evals, teacher data): a bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """A bar on a terminal; elsewhere (a log file, CI, a pipe) a line on stderr at each tenth of
    the work and at least every `LINE_EVERY_S` seconds once it has taken `QUIET_S`, so a long
    build never looks hung and a short eval stays quiet."""
    if not enabled:
        yield lambda n: None
        return
    if not sys.stderr.isatty():
        lines = _Lines(label, total)
        yield lines.advance
        lines.finish()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


LINE_EVERY_S = 30.0
# Work done within this many seconds prints nothing (an eval of a few batches).
QUIET_S = 5.0


class _Lines:
    """Progress as plain lines: `label: done/total (pct%), elapsed`."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.start = self.last = time.monotonic()
        self.tenth = 0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        tenth = self.done * 10 // self.total if self.total else 0
        if now - self.start < QUIET_S:
            self.tenth = tenth  # work this short needs no progress lines
            return
        if self.done < self.total and (tenth > self.tenth or now - self.last >= LINE_EVERY_S):
            self.tenth, self.last = tenth, now
            self._line(now)

    def finish(self) -> None:
        now = time.monotonic()
        if self.done and now - self.start >= QUIET_S:
            self._line(now)

    def _line(self, now: float) -> None:
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        print(
            f"{self.label}: {self.done}/{self.total}{pct}, {now - self.start:.0f} s",
            file=sys.stderr,
            flush=True,
        )


@contextmanager
def hf_bars_off() -> Iterator[None]:
    """transformers' own bars ("Loading weights", "Writing model shards") off for a block: the
    tool prints its own progress, and theirs would interleave with it."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class StepBar:
    """A training progress line: step, loss and the method's headline figures."""

    SHOWN = ("train/loss", "kl/reverse_kl_mean", "train/ce_loss", "student/accuracy", "perf/step_time_s")

    def __init__(
        self, label: str, total: int, start: int = 0, say: Callable[[str], None] | None = None
    ) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[figures]}"),
            disable=not sys.stderr.isatty(),
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=start, figures="")
        self._tty = sys.stderr.isatty()
        self._total = total
        # Off a terminal the lines go through `say` (a grid prefixes them with its cell).
        self._say = say or (lambda line: print(line, flush=True))

    def update(self, step: int, metrics: dict[str, float]) -> None:
        figures = "  ".join(f"{k.split('/')[-1]} {metrics[k]:.3g}" for k in self.SHOWN if k in metrics)
        self._progress.update(self._task, completed=step, figures=figures)
        # Off a terminal (CI, nohup) print a line every tenth of the run instead of a bar.
        if not self._tty and (step % max(1, self._total // 10) == 0 or step == self._total):
            self._say(f"step {step}/{self._total}  {figures}")

    def close(self) -> None:
        self._progress.stop()
