"""The bridge between a TRL trainer and a distill run: metrics, evals and checkpoints.

Every method runs on a transformers/TRL trainer; this callback translates the trainer's log
lines into distill's metric vocabulary (DESIGN.md), runs the periodic eval, and turns the
trainer's `checkpoint-N` folders into `step-N` once they are complete (the rename is the commit
point, so a killed save never looks like a checkpoint).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from transformers import TrainerCallback

from distill import requeue
from distill.hardware import model_shape, reset_gpu_peak, step_metrics
from distill.kernels import compiled
from distill.kernels.heads import default_chunk_rows, head_shape
from distill.kernels.sharded import full_weights, track_optimizer
from distill.launch import (
    barrier,
    broadcast,
    configured_state,
    record_launch,
    reduce_metrics,
    strategy,
    world_size,
)
from distill.progress import StepBar

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

    from distill.methods.context import RunContext

# The longest a checkpoint waits for the tracker to send its queued points.
CHECKPOINT_SYNC_S = 30.0

# trainer log key -> distill metric name
RENAME = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "learning_rate": "train/lr",
}


class DistillCallback(TrainerCallback):
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._step_start = time.perf_counter()
        self._last_step_time = float("nan")
        self._bar: Any = None
        # On a GPU: the student's shape and device, for `perf/mfu` and `perf/gpu_mem_peak_gb`.
        self._shape: dict[str, int] | None = None
        self._device: Any = None
        # A grid cell on SLURM: the step at which the run checkpoints and stops to be requeued.
        self._requeue = False
        self._requeue_step: int | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ):
        self._requeue = requeue.listen()
        model = kw.get("model")
        if model is not None:  # ZeRO-3: whose hooks `full_weights` lifts for rank-local inference
            track_optimizer(model, kw.get("optimizer"))
        if not state.is_world_process_zero:
            return  # one progress bar per run, rank 0's
        if model is not None:
            self._device = next(model.parameters()).device
            self._shape = model_shape(model) if self._device.type == "cuda" else None
            # The head's declared rows: under ZeRO-3 its weight holds 0 rows outside a forward.
            vocab = head_shape(model)[0]
            # The output head's rows per chunk on this device (kernels/heads.py), once a run.
            self.ctx.log.tracker.set_tags(
                {"kernels.chunk_rows": str(default_chunk_rows(vocab, self._device))}
            )
        self._bar = StepBar(
            f"training {self.ctx.config.method.name}", state.max_steps, state.global_step, say=self.ctx.say
        )

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        if self._bar is not None:
            self._bar.close()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        self._step_start = time.perf_counter()
        if self._shape is not None:
            reset_gpu_peak(self._device)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        self._last_step_time = time.perf_counter() - self._step_start
        every = self.ctx.config.eval.every_steps
        if every and state.global_step % every == 0 and state.global_step < state.max_steps:
            model = kw.get("model")
            if model is not None:
                self._evaluate(state.global_step, model)
        # Every rank stops at the step rank 0 saw the signal at (one collective per step, on SLURM only).
        if self._requeue and broadcast(requeue.requested()):
            control.should_save = control.should_training_stop = True
            self._requeue_step = state.global_step

    def _evaluate(self, step: int, model: Any) -> None:
        """Rank 0 evaluates the live student while the other ranks wait in the next collective. A
        sharded student is gathered whole on every rank first: its forwards are collectives."""
        with full_weights(model):
            if self.ctx.evaluate_student is not None:
                was_training = model.training
                model.eval()
                self.ctx.evaluate_student(step, model)
                if was_training:
                    model.train()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kw: Any,
    ):
        if not logs or "train_runtime" in logs:
            return
        metrics: dict[str, float] = {}
        for key, value in logs.items():
            if key in RENAME and isinstance(value, (int, float)):
                metrics[RENAME[key]] = float(value)

        pending = self.ctx.log.pending
        # Every rank calls on_log at the same step: the figures become the whole step's.
        metrics.update(reduce_metrics(pending))
        pending.clear()
        metrics["perf/step_time_s"] = self._last_step_time
        # Writing this run's records since the last line (that line, samples, evals): the write of
        # this line itself counts in the next one.
        metrics["perf/tracking_s"] = self.ctx.log.spent
        self.ctx.log.spent = 0.0
        if graphs := compiled.compiled_graphs():  # shapes compiled so far: flat after warm-up
            metrics["perf/compiled_graphs"] = float(graphs)
        tokens = metrics.pop("_tokens", None)
        seq_len = metrics.pop("_seq_len_max", 0.0)  # the longest row of any rank (reduce_metrics)
        if tokens is not None and self._last_step_time > 0:
            metrics["perf/tokens_per_s"] = tokens / self._last_step_time
            if self._shape is not None:
                # `_tokens` is every rank's: MFU is one device's share against one device's peak.
                per_device = int(tokens / world_size())
                perf = step_metrics(self._shape, per_device, int(seq_len), self._last_step_time, self._device)
                metrics.update(perf)
        self.ctx.log.write(state.global_step, metrics)
        if self._bar is not None:
            self._bar.update(state.global_step, metrics)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        # Every rank writes its part (its RNG state, its shards) before rank 0 commits the folder.
        barrier()
        src = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        dst = self.ctx.run.checkpoint(state.global_step)
        if src.is_dir() and state.is_world_process_zero:
            tracker = self.ctx.log.tracker
            # MLflow level with metrics.jsonl before the commit point, not after it: a kill between
            # the rename and the sync would leave a checkpoint whose points MLflow lacks. Bounded,
            # and skipped while the store is down, so a slow or unreachable store never holds the run.
            tracker.sync(CHECKPOINT_SYNC_S)
            record_launch(src)  # which launcher and process count a resume must match (launch.py)
            if dst.exists():
                import shutil

                shutil.rmtree(dst)
            os.replace(src, dst)
            tracker.set_tags({"checkpoint.last": str(dst)})
        if state.global_step == self._requeue_step:
            raise requeue.StopForRequeue(
                f"stopped to be requeued ({requeue.ENV}): checkpoint step-{state.global_step} written"
            )


TrainerT = TypeVar("TrainerT", bound="Trainer")


def quiet(trainer: TrainerT) -> TrainerT:
    """distill prints its own progress; drop the trainer's dict-per-step printer."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def trainer_common_args(ctx: RunContext) -> dict[str, Any]:
    """TrainingArguments shared by every method: distill owns logging and checkpoint naming."""
    cfg = ctx.config
    every = cfg.checkpoint.every_steps
    deepspeed = strategy() in ("zero3", "deepspeed")
    return dict(
        output_dir=str(ctx.checkpoints_dir),
        max_steps=cfg.optim.max_steps,
        learning_rate=cfg.optim.lr,
        lr_scheduler_type=cfg.optim.scheduler,
        warmup_steps=int(cfg.optim.warmup_ratio * cfg.optim.max_steps),
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.max_grad_norm,
        gradient_accumulation_steps=cfg.optim.grad_accum,
        gradient_checkpointing=cfg.optim.gradient_checkpointing,
        logging_steps=cfg.tracking.log_every_steps,
        save_strategy="steps",
        save_steps=every if every else cfg.optim.max_steps,
        save_only_model=False,
        report_to="none",
        disable_tqdm=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        # Where the student was placed (engines/placement.py): a student pinned to the CPU beside
        # a GPU stays there instead of being moved by the Trainer. DeepSpeed picks its own device
        # (its CPU accelerator on a CPU-only host); accelerate runs DeepSpeed only when not told cpu.
        use_cpu=ctx.student.model.device.type == "cpu" and not deepspeed,
        # DeepSpeed on a CPU-only host: accelerate finds no device backend there and would count
        # one process; gloo is the backend DeepSpeed's CPU accelerator uses.
        ddp_backend="gloo" if deepspeed and ctx.student.model.device.type == "cpu" else None,
        # FSDP on a CPU-only host: the accelerate state launch.py configured (accelerate would
        # otherwise build a data-parallel one there).
        accelerator_config={"use_configured_state": True} if configured_state() else None,
        # TRL's configs default to bf16 autocast; distill's precision is the dtype the weights are
        # loaded in (student.precision), never a silent autocast.
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
