"""A mix that trains one domain a step (`domain.alternate`): which domain each step trains and
with which prompts, the lr it trains at (`domain.lr`), and with
`domain.optimizer_state=per_domain` the Adam moments it steps with.

Why moments of its own: the weights are shared by the domains, but Adam's running averages
would be too. With one optimizer state, a dapo step moves the student by 0.9 of the momentum
the rlve steps before it built, and its step size is divided by a second moment both domains'
gradients fill: each domain's update is a blend of the two whatever lr it has. With a state per
domain, each domain's steps follow its own gradients' direction and scale, as in a run of its
own. The cost: one optimizer state per domain (8 bytes a parameter each for AdamW in fp32).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from distill.domains.mixed import alternating_order, step_plan
from distill.domains.mixed.config import MixConfig

if TYPE_CHECKING:
    from distill.domains.base import Item
    from distill.methods.context import RunContext

# In each `step-N` folder of a run with per-domain moments: every domain's optimizer state.
MOMENTS_FILE = "domain_moments.pt"


def plan(ctx: RunContext) -> list[str] | None:
    """The domain of each step of a mix with `domain.alternate` (None: every step mixed)."""
    domain = ctx.config.domain
    if not isinstance(domain, MixConfig) or not domain.alternate:
        return None
    return step_plan(domain.weights(), ctx.config.optim.max_steps)


def prompt_order(ctx: RunContext, items: list[Item]) -> Sequence[int] | None:
    """The training items in step order, each step's from its domain alone (None: not alternating,
    the trainer shuffles them)."""
    steps = plan(ctx)
    if steps is None:
        return None
    cfg = ctx.config
    # One optimizer step takes rollout.prompts_per_step prompts for each of its optim.grad_accum passes.
    return alternating_order(items, steps, cfg.rollout.prompts_per_step * cfg.optim.grad_accum, cfg.seed)


def lr_factors(ctx: RunContext) -> list[float] | None:
    """Each step's lr over optim.lr with `domain.alternate`: its domain's `domain.lr`."""
    steps = plan(ctx)
    if steps is None:
        return None
    lr = ctx.config.optim.lr
    assert isinstance(ctx.config.domain, MixConfig)
    rates = ctx.config.domain.rates(lr)
    return [rates[part] / lr for part in steps]


def scaled(scheduler: Any, factors: list[float]) -> torch.optim.lr_scheduler.LambdaLR:
    """`scheduler`'s schedule (optim.scheduler) times each step's factor: a function of the step
    alone, so a resumed run's lr is the uninterrupted run's."""
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)  # every optim.scheduler is one
    shape = scheduler.lr_lambdas[0]
    last = len(factors) - 1
    return torch.optim.lr_scheduler.LambdaLR(
        scheduler.optimizer, lambda step: shape(step) * factors[min(step, last)]
    )


def moments(ctx: RunContext) -> list[TrainerCallback]:
    """The callback that keeps each domain's optimizer state, where the run asks for it."""
    domain = ctx.config.domain
    steps = plan(ctx)
    if steps is None or not isinstance(domain, MixConfig) or domain.optimizer_state != "per_domain":
        return []
    return [DomainMoments(steps, ctx.resume_from)]


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    # accelerate's AcceleratedOptimizer wraps the torch optimizer whose `state` the step reads.
    while not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


class DomainMoments(TrainerCallback):
    """Before each optimizer step, the optimizer's state becomes the state of that step's domain;
    each `step-N` holds every domain's (MOMENTS_FILE), so a resumed run steps on as the
    uninterrupted one."""

    def __init__(self, steps: list[str], resume_from: Path | None) -> None:
        self.steps = steps
        self.resume_from = resume_from
        self.states: dict[str, Any] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
        if self.resume_from is None:
            return
        path = self.resume_from / MOMENTS_FILE
        if not path.exists():
            raise ValueError(
                f"{self.resume_from} has no {MOMENTS_FILE}: the domains' optimizer states are not in it"
            )
        inner = _inner(optimizer)
        groups, current = inner.state_dict()["param_groups"], inner.state
        for part, saved in torch.load(path, weights_only=True).items():
            inner.load_state_dict({"state": saved, "param_groups": groups})
            self.states[part] = inner.state
        inner.state = current

    def on_pre_optimizer_step(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any
    ) -> None:
        part = self.steps[min(state.global_step, len(self.steps) - 1)]
        _inner(optimizer).state = self.states.setdefault(part, defaultdict(dict))

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
        if not (control.should_save and state.is_world_process_zero):
            return
        # Into the `checkpoint-N` folder before the Trainer writes the rest of it (as the EMA
        # teacher is, methods/privileged.py): `step-N` never lacks it.
        folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        inner = _inner(optimizer)
        current, saved = inner.state, {}
        try:
            for part, held in self.states.items():
                inner.state = held
                saved[part] = inner.state_dict()["state"]
        finally:
            inner.state = current
        torch.save(saved, folder / MOMENTS_FILE)
