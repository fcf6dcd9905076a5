"""`rollout.async_teacher`: the teacher scores batch i while the student generates batch i+1 and
trains on batch i (the overlap verl's OPD plan describes).

One step on the trainer's thread, with batch i+1's prompts taken one step early from the data
loader (`lookahead`):

    generate i+1 (student, in process) ........ | wait | train on i
    teacher scores i (server, or worker process) |      | teacher scores i+1 ...

The staleness is one step and explicit: batch i+1 is sampled by the weights before step i's
update and trained after it. The loss stays exact for the batch being trained: the student's
logprobs are recomputed in the loss forward (on_policy.py), and the teacher's belong to the
tokens actually sampled. `perf/teacher_time_s` is the teacher's own time for the trained batch,
`perf/teacher_wait_s` what the step waited for it, `perf/overlap_s` the part hidden behind
generation and training. The first step, and the first after a checkpoint or an epoch's end,
has nothing in flight and scores synchronously: a run resumed from a checkpoint then continues
exactly as the uninterrupted one (one synchronous step per `checkpoint.every_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from distill.engines.worker import WorkerEngine
from distill.methods.batch import Batches, Rollouts, Scorer

if TYPE_CHECKING:
    from distill.engines.base import TokenScores
    from distill.methods.context import RunContext

# This step's rollouts of `inputs` (GRPO's generation and bookkeeping), timed.
Generate = Callable[[list[dict[str, Any]]], Rollouts]
# The trainer's batch from a step's rollouts, the teacher's scores of them and the perf figures.
Finish = Callable[[Rollouts, "TokenScores", dict[str, float]], dict[str, Any]]


def teacher_scorer(ctx: RunContext) -> tuple[Scorer, WorkerEngine | None]:
    """What scores the teacher's batches off the trainer's thread: a served teacher itself (the
    thread waits on its socket), else a worker process holding its own copy of the teacher."""
    if ctx.config.teacher.engine == "server":
        return ctx.teacher, None
    teacher = ctx.local_teacher()
    worker = WorkerEngine(
        str(teacher.model.name_or_path),
        ctx.config.teacher.precision,
        teacher.enable_thinking,
        ctx.config.threads,
        wait=False,  # it loads while the trainer is set up; the first score waits for it
    )
    return worker, worker


class AsyncTeacher:
    """Keeps one batch in flight with the teacher; see the module docstring."""

    def __init__(self, ctx: RunContext) -> None:
        self._scorer, self._worker = teacher_scorer(ctx)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="distill-teacher")
        self._ahead: tuple[Rollouts, Future[tuple[TokenScores, float]]] | None = None
        self._held: tuple[Any, Any] | None = None
        self._next_inputs: list[dict[str, Any]] | None = None

    def lookahead(self, epoch_iterator: Any, fetch: Callable[[], Any]) -> Any:
        """The trainer's `get_batch_samples`: this step's batches, and the next step's prompts
        kept for generating ahead (none at an epoch's end)."""
        held = self._held
        current = held[1] if held is not None and held[0] is epoch_iterator else fetch()
        upcoming = fetch()
        samples = upcoming[0]
        self._held = (epoch_iterator, upcoming) if samples else None
        self._next_inputs = samples[0] if samples else None
        return current

    def step(
        self,
        inputs: list[dict[str, Any]],
        batches: Batches,
        generate: Generate,
        finish: Finish,
        ahead: bool,
    ) -> dict[str, Any]:
        """The trainer's `_generate_and_score_completions` for this step's `inputs`; `ahead`:
        whether the next step's rollouts may be generated now (not before a checkpoint)."""
        current, self._ahead = self._ahead, None
        if current is None or current[0].inputs is not inputs:
            if current is not None:
                current[1].cancel()
            current = self._launch(inputs, batches, generate)
        batch, future = current
        upcoming, self._next_inputs = self._next_inputs, None
        if upcoming is not None and ahead:
            # The student generates batch i+1 while the teacher scores batch i.
            self._ahead = self._launch(upcoming, batches, generate)
        start = time.perf_counter()
        teacher, teacher_time = future.result()
        wait = time.perf_counter() - start
        perf = {
            "perf/teacher_time_s": teacher_time,
            "perf/teacher_wait_s": wait,
            "perf/overlap_s": max(teacher_time - wait, 0.0),
        }
        return finish(batch, teacher, perf)

    def _launch(
        self, inputs: list[dict[str, Any]], batches: Batches, generate: Generate
    ) -> tuple[Rollouts, Future[tuple[TokenScores, float]]]:
        batch = generate(inputs)
        return batch, self._pool.submit(self._score, batches, batch)

    def _score(self, batches: Batches, batch: Rollouts) -> tuple[TokenScores, float]:
        start = time.perf_counter()
        scores = batches.score(self._scorer, batch)
        return scores, time.perf_counter() - start

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._worker is not None:
            self._worker.close()
