"""`rollout.async_teacher`: the teacher scores batch i while the student generates batch i+1 and
trains on batch i (the overlap verl's OPD plan describes).

One step on the trainer's thread, with batch i+1's prompts taken one step early from the data
loader (`lookahead`):

    generate i+1 (student, in process) ........ | wait | train on i
    teacher scores i (server, or worker process) |      | teacher scores i+1 ...

Each teacher scores from a thread of its own, through its engine: a server, or the worker process
that holds its weights (prepare.py loads an hf teacher there and nowhere else; an in-process
engine, as a program may hand one, scores from the thread). Two domains of one teacher go to it
from one thread, one after the other: its time for a batch is the sum of theirs, and the batch's
teacher time the slowest teacher's.

The staleness is one step and explicit: batch i+1 is sampled by the weights before step i's
update and trained after it. The loss stays exact for the batch being trained: the student's
logprobs are recomputed in the loss forward (on_policy.py), and the teacher's belong to the
tokens actually sampled. `perf/teacher_time_s` is the teachers' own time for the trained batch
(as in a synchronous step: from the first request to the last answer), `perf/teacher_wait_s`
what the step waited for it, `perf/overlap_s` the part hidden behind generation and training.
The first step, and the first after a checkpoint or an epoch's end, has nothing in flight and
scores synchronously: a run resumed from a checkpoint then continues exactly as the
uninterrupted one (one synchronous step per `checkpoint.every_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from distill.methods.batch import Batches, Rollouts, Scorer, TeacherSide

if TYPE_CHECKING:
    from distill.engines.base import TokenScores

# This step's rollouts of `inputs` (GRPO's generation and bookkeeping), timed.
Generate = Callable[[list[dict[str, Any]]], Rollouts]
Scored = dict[str, tuple["TokenScores", float]]
# The trainer's batch from a step's rollouts, the teachers' scores of them and the perf figures.
Finish = Callable[[Rollouts, Scored, dict[str, float]], dict[str, Any]]
# One teacher's scores of its domains' rows, and its own seconds for all of them.
GroupScored = tuple[Scored, float]


def scorer_groups(teachers: dict[str, TeacherSide]) -> list[dict[str, Scorer]]:
    """The domains of each teacher engine (one group a teacher, in the domains' order)."""
    groups: dict[int, dict[str, Scorer]] = {}
    for part, side in teachers.items():
        groups.setdefault(id(side.engine), {})[part] = side.engine
    return list(groups.values())


def teacher_perf(groups: list[GroupScored], wait: float) -> dict[str, float]:
    """A step's teacher figures from each teacher's (scores, seconds) and the seconds the step
    waited for them: the teachers score side by side, each its domains one after the other, so
    the batch's teacher time is the slowest teacher's sum; what the step did not wait of it was
    hidden behind generation and training."""
    teacher_time = max((seconds for _, seconds in groups), default=0.0)
    return {
        "perf/teacher_time_s": teacher_time,
        "perf/teacher_wait_s": wait,
        "perf/overlap_s": max(teacher_time - wait, 0.0),
    }


def _timed(batches: Batches, group: dict[str, Scorer], batch: Rollouts) -> GroupScored:
    start = time.perf_counter()
    scored = batches.score(group, batch)
    return scored, time.perf_counter() - start


class AsyncTeacher:
    """Keeps one batch in flight with the teachers; see the module docstring."""

    def __init__(self, teachers: dict[str, TeacherSide]) -> None:
        # One thread a teacher: several teachers score their rows of a batch at once, and two
        # domains of one teacher go to it from one thread, one after the other. Each its own
        # queue: a teacher's next batch waits for its current one, never for another teacher's,
        # and never reaches it from a second thread (a worker answers one request at a time).
        self._groups = scorer_groups(teachers)
        self._pools = [ThreadPoolExecutor(1, thread_name_prefix="distill-teacher") for _ in self._groups]
        self._ahead: tuple[Rollouts, list[Future[GroupScored]]] | None = None
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
                for future in current[1]:
                    future.cancel()
            current = self._launch(inputs, batches, generate)
        batch, futures = current
        upcoming, self._next_inputs = self._next_inputs, None
        if upcoming is not None and ahead:
            # The student generates batch i+1 while the teachers score batch i.
            self._ahead = self._launch(upcoming, batches, generate)
        start = time.perf_counter()
        groups = [future.result() for future in futures]
        wait = time.perf_counter() - start
        scored: Scored = {part: each for group, _ in groups for part, each in group.items()}
        return finish(batch, scored, teacher_perf(groups, wait))

    def _launch(
        self, inputs: list[dict[str, Any]], batches: Batches, generate: Generate
    ) -> tuple[Rollouts, list[Future[GroupScored]]]:
        batch = generate(inputs)
        futures = [
            pool.submit(_timed, batches, group, batch)
            for pool, group in zip(self._pools, self._groups, strict=True)
        ]
        return batch, futures

    def close(self) -> None:
        if self._ahead is not None:
            for future in self._ahead[1]:
                future.cancel()
        for pool in self._pools:
            pool.shutdown(wait=True, cancel_futures=True)
