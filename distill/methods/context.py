"""What a method gets from the runner: the config, the run folder, the domain, the engines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from distill import registry
from distill.engines.hf import HFEngine
from distill.kernels.sharded import sharding_of, whole_loading
from distill.launch import is_main_process
from distill.tracking.rundir import RunDir, step_of

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.evals.single_turn import EvalResult
    from distill.tracking.steplog import StepRecord


M = TypeVar("M")


@dataclass
class RunContext:
    config: RunConfig
    run: RunDir
    domain: Domain
    # The student trains in this process; the teacher may be served (`teacher.engine=server`).
    student: HFEngine
    teacher: Engine
    log: StepRecord
    # A complete checkpoint folder to continue from (`distill run --resume`).
    resume_from: Path | None = None
    # Called with (step, live student model) every eval.every_steps; returns the eval result.
    evaluate_student: Callable[[int, Any], EvalResult] | None = None
    # The training items by position: a trainer's dataset holds their indices.
    items: list[Item] = field(default_factory=list)
    # Extra transformers TrainerCallbacks for the method's trainer (programmatic runs, benchmarks).
    callbacks: Sequence[Any] = ()
    # Where the run's lines go (the CLI's echo; a grid prefixes them with the cell).
    say: Callable[[str], None] = print
    # A run over several domains: each domain's teacher (`teachers.<domain>`); empty: `teacher`
    # teaches every domain.
    teachers: dict[str, Engine] = field(default_factory=dict)

    def teacher_engines(self) -> dict[str, Engine]:
        """Each domain's teacher engine (one domain: {domain: teacher})."""
        parts = registry.domain_parts(self.config.domain.name)
        return {part: self.teachers.get(part, self.teacher) for part in parts}

    def method_as(self, kind: type[M]) -> M:
        """The run's method config as the model a method's code expects (the registry sends a
        method's runs to its own code, so a mismatch is a programming error)."""
        method = self.config.method
        if not isinstance(method, kind):
            raise TypeError(f"{type(method).__name__} where {kind.__name__} was expected")
        return method

    @property
    def checkpoints_dir(self) -> Path:
        return self.run.checkpoints

    def local_teacher(self) -> HFEngine:
        """The teacher's in-process engine, for the paths that need its weights (compat.py refuses
        a served teacher for them at config time)."""
        if not isinstance(self.teacher, HFEngine):
            raise ValueError(f"{self.config.method.name}: this path needs the teacher's weights in-process")
        return self.teacher


def train_or_take_final(ctx: RunContext, train: Callable[[RunContext], None]) -> HFEngine:
    """Train, or, when the resume's checkpoint already holds the last step (a run stopped in its
    final eval), take that checkpoint's weights: transformers' Trainer resumed at `max_steps`
    would still run one more step before it checks the limit."""
    done = ctx.resume_from
    if done is None or (step_of(done) or 0) < ctx.config.optim.max_steps:
        train(ctx)
        # A sharded student holds a shard of each weight on each rank, and what follows (the final
        # eval) runs on rank 0 alone: it takes the final checkpoint's whole weights.
        if sharding_of(ctx.student.model) is None or not is_main_process():
            return ctx.student
        done = ctx.run.checkpoint(ctx.config.optim.max_steps)
    else:
        ctx.say(
            f"training: all {ctx.config.optim.max_steps} steps are in {done.name}; the final eval follows"
        )
    import torch

    spec = ctx.config.student
    with whole_loading():
        final = HFEngine.load(str(done), spec.precision, spec.enable_thinking)
    # Where training left the student (a GPU run); torch's `to`, which transformers' typing hides.
    torch.nn.Module.to(final.model, ctx.student.model.device)
    return final
