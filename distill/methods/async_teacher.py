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

from distill.methods import on_policy

if TYPE_CHECKING:
    from distill.engines.base import TokenScores
    from distill.methods.context import RunContext
    from distill.methods.on_policy import Rollouts

Generate = Callable[[list[dict[str, Any]]], tuple[dict[str, Any], float]]


def _last_before_checkpoint(trainer: Any) -> bool:
    """Whether this step is the run's last or ends in a checkpoint. Nothing is generated ahead
    then: a run resumed from that checkpoint starts with nothing in flight, and so does the run
    that was never stopped, so the two stay equal bit for bit (tests/e2e/test_kill_resume.py)."""
    step, args = trainer.state.global_step + 1, trainer.args
    if step >= trainer.state.max_steps:
        return True
    every = int(args.save_steps or 0) if args.save_strategy == "steps" else 0
    return every > 0 and step % every == 0


class AsyncTeacher:
    """Keeps one batch in flight with the teacher; see the module docstring."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._worker: Any = None
        if ctx.config.teacher.engine == "server":
            self._scorer: Any = ctx.teacher  # HTTP: the thread below waits on the socket
        else:
            from distill.engines.worker import WorkerEngine

            teacher = ctx.local_teacher()
            self._worker = self._scorer = WorkerEngine(
                str(teacher.model.name_or_path),
                ctx.config.teacher.precision,
                teacher.enable_thinking,
                ctx.config.threads,
                wait=False,  # it loads while the trainer is set up; the first score waits for it
            )
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

    def step(self, trainer: Any, inputs: list[dict[str, Any]], generate: Generate) -> dict[str, Any]:
        """The trainer's `_generate_and_score_completions` for this step's `inputs`."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead[0].inputs is not inputs:
            if ahead is not None:
                ahead[1].cancel()
            ahead = self._launch(trainer, inputs, generate)
        batch, future = ahead
        upcoming, self._next_inputs = self._next_inputs, None
        if upcoming is not None and not _last_before_checkpoint(trainer):
            # The student generates batch i+1 while the teacher scores batch i.
            self._ahead = self._launch(trainer, upcoming, generate)
        start = time.perf_counter()
        teacher, teacher_time = future.result()
        wait = time.perf_counter() - start
        perf = {
            "perf/teacher_time_s": teacher_time,
            "perf/teacher_wait_s": wait,
            "perf/overlap_s": max(teacher_time - wait, 0.0),
        }
        return on_policy.with_teacher(trainer, batch, teacher, perf)

    def _launch(
        self, trainer: Any, inputs: list[dict[str, Any]], generate: Generate
    ) -> tuple[Rollouts, Future[tuple[TokenScores, float]]]:
        out, gen_time = generate(inputs)
        batch = on_policy.rollouts(trainer, inputs, out, gen_time)
        return batch, self._pool.submit(self._score, batch)

    def _score(self, batch: Rollouts) -> tuple[TokenScores, float]:
        start = time.perf_counter()
        scores = on_policy.score_teacher(self.ctx, self._scorer, batch)
        return scores, time.perf_counter() - start

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead[1].cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._worker is not None:
            self._worker.close()
