"""Teacher-SFT: the teacher writes complete trajectories, the student is fine-tuned on them.

Trajectories are written by the teacher engine for the training prompts (optionally keeping only
those the domain's verifier accepts), saved to `data/teacher_trajectories.jsonl` in the run, and
trained with TRL's `SFTTrainer` (CE on the completion tokens only).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from distill.config import SFTMethod
from distill.kernels.states import ce_loss
from distill.launch import barrier, is_main_process, per_device
from distill.methods.budget import teacher_budget
from distill.methods.callbacks import quiet, trainer_common_args
from distill.methods.context import RunContext
from distill.methods.online import CECallback, live_model
from distill.progress import progress_bar


def write_trajectories(ctx: RunContext) -> list[dict[str, Any]]:
    path = ctx.run.data / "teacher_trajectories.jsonl"
    # A resumed run trains on the same data, not a fresh draw. Several processes: rank 0 writes
    # them, and every process trains on that one file.
    if is_main_process() and not path.exists():
        _write_rows(path, _teacher_rows(ctx))
    barrier()
    return [json.loads(line) for line in path.read_text().splitlines()]


def _teacher_rows(ctx: RunContext) -> list[dict[str, Any]]:
    """The teacher's trajectories for as many training prompts as the run's steps need."""
    cfg = ctx.config
    method = ctx.method_as(SFTMethod)
    needed = math.ceil(cfg.optim.max_steps * cfg.optim.batch_size * cfg.optim.grad_accum / method.epochs)
    items = ctx.domain.train_items()
    prompts_needed = min(len(items), math.ceil(needed / method.samples_per_prompt))
    items = items[:prompts_needed]
    teacher = ctx.teacher
    prompt_ids = [teacher.prompt_ids(item.prompt) for item in items for _ in range(method.samples_per_prompt)]
    expanded = [item for item in items for _ in range(method.samples_per_prompt)]
    with progress_bar("teacher trajectories", total=len(prompt_ids)) as advance:
        completions = teacher.generate(
            prompt_ids, cfg.teacher_sampling(), batch_size=cfg.eval.batch_size, progress=advance
        )
    scores = ctx.domain.score_batch(expanded, [c.text for c in completions])
    rows = []
    for item, comp, score in zip(expanded, completions, scores, strict=True):
        rows.append(
            {
                "item_id": item.id,
                "prompt": item.prompt,
                "completion": comp.text,
                "tokens": len(comp.ids),
                "truncated": comp.truncated,
                "correct": score.correct,
            }
        )
    return rows


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def check_budget(ctx: RunContext, rows: list[dict[str, Any]], kept: list[dict[str, Any]]) -> None:
    """Log the teacher's budget figures (step 0) and stop when nothing is left to train on.

    The budget is rollout.max_new_tokens; the figures cover every trajectory the teacher wrote,
    in its own tokens, and are logged before anything can stop the run: a truncated teacher is
    the usual reason nothing passes the verifier.
    """
    cfg = ctx.config
    budget = teacher_budget(
        [r["tokens"] for r in rows], [r["truncated"] for r in rows], cfg.rollout.max_new_tokens
    )
    # A resumed run kept these step-0 figures in metrics.jsonl (and MLflow): each point once.
    if not any(row["step"] == 0 and "teacher/verified_rate" in row for row in ctx.run.metric_rows()):
        ctx.log.write(
            0,
            {
                **budget,
                "teacher/verified_rate": sum(r["correct"] for r in rows) / len(rows),
                "teacher/kept_trajectories": float(len(kept)),
            },
        )
        ctx.log.samples(0, rows[: cfg.tracking.sample_rows])
    if not kept:
        truncated = sum(r["truncated"] for r in rows)
        cause = (
            f"; {truncated} of {len(rows)} ended at rollout.max_new_tokens={cfg.rollout.max_new_tokens} "
            "without EOS (raise it)"
            if truncated
            else ""
        )
        raise ValueError(
            "sft: no teacher trajectory passed the verifier; the teacher cannot solve these prompts"
            f"{cause} (set method.keep_verified_only=false to train on them anyway)"
        )


def train(ctx: RunContext) -> None:
    from datasets import Dataset
    from trl import SFTConfig

    cfg = ctx.config
    method = ctx.method_as(SFTMethod)
    rows = write_trajectories(ctx)
    kept = [r for r in rows if r["correct"]] if method.keep_verified_only else rows
    check_budget(ctx, rows, kept)
    dataset = Dataset.from_list(
        [{"prompt": ctx.student.render(r["prompt"]), "completion": r["completion"]} for r in kept]
    )
    args = SFTConfig(
        **trainer_common_args(ctx),
        # optim.batch_size is the global batch, split over the training processes.
        per_device_train_batch_size=per_device(cfg.optim.batch_size, "optim.batch_size"),
        completion_only_loss=True,
        packing=False,
        max_length=None,
        dataset_num_proc=None,
    )

    fit_sft(ctx, args, dataset)


def fit_sft(ctx: RunContext, args: Any, dataset: Any) -> None:
    """Run `trl.SFTTrainer` on a prepared dataset, logging CE as `train/ce_loss` (teacher-SFT on
    trajectories and on SciWorld episodes share it)."""
    trainer = chunked_sft_trainer()(
        model=ctx.student.model,
        args=args,
        train_dataset=dataset,
        processing_class=ctx.student.tokenizer,
        callbacks=[CECallback(ctx), *ctx.callbacks],
    )
    quiet(trainer).train(resume_from_checkpoint=str(ctx.resume_from) if ctx.resume_from else None)
    ctx.student.model = live_model(trainer)


def chunked_sft_trainer() -> type:
    """`trl.SFTTrainer` with its loss through distill's chunked head: TRL's own fused head holds
    [4096 tokens, 32768 vocab] fp32 tiles on CPU (~1-2 GB at any length, benchmarks/scale_memory.py)."""
    from trl import SFTTrainer

    class ChunkedSFTTrainer(SFTTrainer):
        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            loss = ce_loss(model, self.accelerator.unwrap_model(model), inputs, num_items_in_batch)
            return (loss, None) if return_outputs else loss

    return ChunkedSFTTrainer
