"""The online trainer ROSE and the episode methods share: a batch of item indices becomes a batch
of fresh rollouts inside each `training_step`, from the live student.

The update runs on a `transformers.Trainer`, so the optimizer, scheduler, clipping, gradient
accumulation, checkpoints and resume are the Trainer's, and `DistillCallback` (metrics, periodic
eval, step-N) works unchanged. TRL's SFTTrainer adds only dataset preparation these methods
cannot use (their batch exists only after this step's rollouts); GRPOTrainer's loss is a policy
gradient over one rollout, which a teacher's continuation cannot be spliced into.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel, Trainer, TrainingArguments

from distill.engines.hf import HFEngine
from distill.kernels.states import ce_loss
from distill.launch import per_device, rank
from distill.methods.callbacks import DistillCallback, quiet, trainer_common_args

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState

    from distill.domains.base import Item
    from distill.methods.context import RunContext

IGNORE = -100


class CECallback(DistillCallback):
    """DistillCallback for methods whose trainer loss is the CE on teacher tokens (`train/ce_loss`)."""

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        if logs and "loss" in logs:
            self.ctx.log.add({"train/ce_loss": float(logs["loss"])})
        super().on_log(args, state, control, logs=logs, **kw)


class MicroBatches:
    """Which micro-batch of its optimizer step a `training_step` is, and its own draws: a function
    of (run seed, step, micro-batch) only, so every gradient-accumulation micro-batch draws its
    own and a run resumed at a step draws what the uninterrupted run drew there."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.step = -1  # the optimizer step the micro-batches being counted belong to
        self.index = 0  # how many of its micro-batches so far

    def begin(self, step: int) -> bool:
        """Count a micro-batch of `step`; True on the first one of the step."""
        first = step != self.step
        if first:
            self.step, self.index = step, 0
        self.index += 1
        return first

    def rng(self) -> random.Random:
        """This micro-batch's own random stream."""
        return random.Random(self.seed * 1_000_003 + self.step * 1_009 + self.index)

    def sample_rng(self, sample: int) -> random.Random:
        """The stream of sample `sample` of this micro-batch's global batch (every process's samples
        in order): a sample draws the same whichever process holds it, and however many there are."""
        return random.Random(f"{self.seed}:{self.step}:{self.index}:{sample}")


class OnlineTrainer(Trainer):
    """A Trainer whose batch of item indices is turned into rollouts inside each step."""

    def __init__(self, ctx: RunContext, **kwargs: Any) -> None:
        self.distill_ctx = ctx
        self._engine: HFEngine | None = None
        self.micro = MicroBatches(ctx.config.seed)
        super().__init__(**kwargs)

    def live_engine(self) -> HFEngine:
        """The live student (unwrapped) as an engine: this step's rollouts use the current weights."""
        if self._engine is None:
            student = self.distill_ctx.student
            self._engine = HFEngine(live_model(self), student.tokenizer, student.enable_thinking)
        return self._engine

    def begin_micro_batch(self) -> bool:
        """Count this micro-batch; True on the first one of an optimizer step."""
        return self.micro.begin(self.state.global_step)

    def step_items(self, inputs: dict[str, Any]) -> list[Item]:
        """This micro-batch's items, each repeated for `rollout.num_generations` samples."""
        ctx = self.distill_ctx
        n = ctx.config.rollout.num_generations
        return [ctx.items[int(i)] for i in inputs["item_index"] for _ in range(n)]

    def sample_rngs(self, count: int) -> list[random.Random]:
        """The streams of this process's `count` samples: its slice of the global batch (the data
        loader gives process r the r-th of equal slices)."""
        return [self.micro.sample_rng(rank() * count + i) for i in range(count)]

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """CE on the labelled tokens, the head applied per chunk of them (never [B, T, vocab])."""
        loss = ce_loss(model, self.accelerator.unwrap_model(model), inputs, num_items_in_batch)
        return (loss, None) if return_outputs else loss

    def ce_step(self, model: Any, examples: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """One CE micro-step on (input_ids, labels) rows through the Trainer's own path."""
        batch = collate(examples, self.distill_ctx.student.tokenizer.pad_token_id)
        return super().training_step(model, batch, None)


def live_model(trainer: Trainer) -> PreTrainedModel:
    """The trainer's model (unwrapped, a transformers model: distill trains no other kind)."""
    model = trainer.model
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"the trainer holds a {type(model).__name__}, not a transformers model")
    return model


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (-100 on padding)."""
    width = max(len(ids) for ids, _ in examples)
    ids_B_T = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels_B_T = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask_B_T = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, labels) in enumerate(examples):
        if len(ids) != len(labels):
            raise ValueError(f"sample {row} has {len(ids)} tokens but {len(labels)} labels")
        ids_B_T[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        labels_B_T[row, : len(labels)] = torch.tensor(labels, dtype=torch.long)
        mask_B_T[row, : len(ids)] = 1
    return {"input_ids": ids_B_T, "attention_mask": mask_B_T, "labels": labels_B_T}


def _indices(rows: list[dict[str, Any]]) -> dict[str, Any]:
    # The batch is built inside training_step from the live student; the loader only picks items.
    return {"item_index": [int(row["item_index"]) for row in rows]}


def run_online(
    ctx: RunContext, trainer_class: Callable[..., OnlineTrainer], callback: DistillCallback
) -> None:
    """Train a `trainer_class(ctx, **trainer_kwargs)` over the domain's training items,
    `rollout.prompts_per_step` a step (`functools.partial` binds a trainer's own arguments, e.g.
    ROSE's tokenizer bridge)."""
    from datasets import Dataset

    ctx.items = ctx.domain.train_items()
    # rollout.prompts_per_step is the global batch, split over the training processes.
    per_process = per_device(ctx.config.rollout.prompts_per_step, "rollout.prompts_per_step")
    args = TrainingArguments(**trainer_common_args(ctx), per_device_train_batch_size=per_process)
    trainer = trainer_class(
        ctx,
        model=ctx.student.model,
        args=args,
        train_dataset=Dataset.from_list([{"item_index": i} for i in range(len(ctx.items))]),
        data_collator=_indices,
        processing_class=ctx.student.tokenizer,
        callbacks=[callback, *ctx.callbacks],
    )
    quiet(trainer).train(resume_from_checkpoint=str(ctx.resume_from) if ctx.resume_from else None)
    ctx.student.model = live_model(trainer)
