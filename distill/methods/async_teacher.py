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

from distill.engines.hf import HFEngine
from distill.engines.placement import place, this_machine
from distill.engines.worker import WorkerEngine
from distill.methods.batch import Batches, Rollouts, Scorer, TeacherSide

if TYPE_CHECKING:
    from distill.engines.base import TokenScores
    from distill.methods.context import RunContext

# This step's rollouts of `inputs` (GRPO's generation and bookkeeping), timed.
Generate = Callable[[list[dict[str, Any]]], Rollouts]
Scored = dict[str, tuple["TokenScores", float]]
# The trainer's batch from a step's rollouts, the teachers' scores of them and the perf figures.
Finish = Callable[[Rollouts, Scored, dict[str, float]], dict[str, Any]]


def teacher_scorers(
    ctx: RunContext, teachers: dict[str, TeacherSide]
) -> tuple[dict[str, Scorer], list[WorkerEngine]]:
    """What scores each domain's batches off the trainer's thread: a served teacher itself (its
    thread waits on the socket), else a worker process holding its own copy of the teacher (one
    per teacher, shared by the domains it teaches)."""
    scorers: dict[str, Scorer] = {}
    workers: dict[int, WorkerEngine] = {}
    for part, side in teachers.items():
        engine = side.engine
        if not isinstance(engine, HFEngine):
            scorers[part] = engine
            continue
        if id(engine) not in workers:
            spec = ctx.config.teacher_of(part)
            workers[id(engine)] = WorkerEngine(
                str(engine.model.name_or_path),
                spec.precision,
                engine.enable_thinking,
                ctx.config.threads,
                wait=False,  # it loads while the trainer is set up; the first score waits for it
                device=place(spec.device, "teacher_worker", this_machine()),
            )
        scorers[part] = workers[id(engine)]
    return scorers, list(workers.values())


class AsyncTeacher:
    """Keeps one batch in flight with the teachers; see the module docstring."""

    def __init__(self, ctx: RunContext, teachers: dict[str, TeacherSide]) -> None:
        scorers, self._workers = teacher_scorers(ctx, teachers)
        # One thread a teacher: several teachers score their rows of a batch at once, and two
        # domains of one teacher go to it from one thread, one after the other (a worker answers
        # one request at a time).
        groups: dict[int, dict[str, Scorer]] = {}
        for part, scorer in scorers.items():
            groups.setdefault(id(scorer), {})[part] = scorer
        self._groups = list(groups.values())
        self._pool = ThreadPoolExecutor(len(self._groups), thread_name_prefix="distill-teacher")
        self._ahead: tuple[Rollouts, list[Future[Scored]]] | None = None
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
        scored: Scored = {}
        for future in futures:
            scored.update(future.result())
        wait = time.perf_counter() - start
        teacher_time = max((seconds for _, seconds in scored.values()), default=0.0)
        perf = {
            "perf/teacher_time_s": teacher_time,
            "perf/teacher_wait_s": wait,
            "perf/overlap_s": max(teacher_time - wait, 0.0),
        }
        return finish(batch, scored, perf)

    def _launch(
        self, inputs: list[dict[str, Any]], batches: Batches, generate: Generate
    ) -> tuple[Rollouts, list[Future[Scored]]]:
        batch = generate(inputs)
        futures = [self._pool.submit(batches.score, group, batch) for group in self._groups]
        return batch, futures

    def close(self) -> None:
        if self._ahead is not None:
            for future in self._ahead[1]:
                future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for worker in self._workers:
            worker.close()
