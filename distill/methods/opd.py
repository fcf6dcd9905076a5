"""On-policy distillation (OPD), sampled-token, on a TRL `GRPOTrainer` subclass.

The student samples (TRL's own generation path, so vLLM works where TRL's does); the teacher
scores the *same* token ids; the per-token advantage is

    A_t = coef * (logp_teacher_t - logp_student_t)        (token_reward_direct: not normalised)

and TRL's importance-sampled policy-gradient loss is applied on completion tokens only (the
prompt is never in the loss). Student tokens, student logprobs and teacher logprobs must have
equal lengths per sample; a mismatch is an error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from distill.methods.context import RunContext
from distill.methods.scoring import check_lengths, opd_advantages, unpad_rows

if TYPE_CHECKING:
    from distill.config import OPDMethod


def _zero_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    # OPD's signal is the teacher's per-token logprobs, set in _generate_and_score_completions.
    return [0.0] * len(completions)


def make_trainer_class() -> type:
    from trl import GRPOTrainer

    class OPDTrainer(GRPOTrainer):
        """GRPOTrainer whose advantages are per-token teacher-student logprob gaps, [B, T]."""

        distill_ctx: RunContext

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            ctx = self.distill_ctx
            method: OPDMethod = ctx.config.method  # type: ignore[assignment]
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_time = time.perf_counter() - start

            completion_mask_B_T = out["completion_mask"]
            prompt_rows = unpad_rows(out["prompt_ids"], out["prompt_mask"])
            completion_rows = unpad_rows(out["completion_ids"], completion_mask_B_T)

            # Student and teacher logprobs come from the same scoring code (same padding, same
            # numerics), so a student identical to its teacher gets exactly zero advantage.
            student_rows = ctx.student.score(prompt_rows, completion_rows)

            t0 = time.perf_counter()
            items = [ctx.extras["items"][int(x["item_index"])] for x in inputs]
            teacher_prompts = [ctx.teacher.prompt_ids(item.prompt) for item in items]
            teacher_rows = ctx.teacher.score(teacher_prompts, completion_rows)
            teacher_time = time.perf_counter() - t0
            check_lengths(completion_rows, student_rows, teacher_rows)

            adv_B_T, stats = opd_advantages(
                teacher_rows, student_rows, completion_mask_B_T.shape, method.coef, method.advantage_clip
            )
            out["advantages"] = adv_B_T.to(completion_mask_B_T.device) * completion_mask_B_T

            texts = ctx.student.tokenizer.batch_decode(completion_rows, skip_special_tokens=True)
            eos = set(ctx.student.eos_ids)
            truncated = [not (row and row[-1] in eos) for row in completion_rows]
            scores = ctx.domain.score_batch(items, texts)
            lengths = [len(c) for c in completion_rows]
            ctx.log.add(
                {
                    **stats,
                    "perf/gen_time_s": gen_time,
                    "perf/teacher_time_s": teacher_time,
                    "student/completion_tokens_mean": sum(lengths) / len(lengths),
                    "student/completion_tokens_max": float(max(lengths)),
                    "student/truncation_rate": sum(truncated) / len(truncated),
                    "student/reward_mean": sum(s.reward for s in scores) / len(scores),
                    "student/accuracy": sum(s.correct for s in scores) / len(scores),
                    "_tokens": float(sum(lengths) + sum(len(p) for p in prompt_rows)),
                }
            )
            n = ctx.config.tracking.sample_rows
            ctx.log.samples(
                self.state.global_step + 1,
                [
                    {
                        "prompt": items[i].prompt,
                        "student": texts[i],
                        "student_tokens": lengths[i],
                        "truncated": truncated[i],
                        "correct": scores[i].correct,
                        "advantage_mean": float(adv_B_T[i, : lengths[i]].mean()) if lengths[i] else 0.0,
                    }
                    for i in range(min(n, len(items)))
                ],
            )
            return out

    return OPDTrainer


def train(ctx: RunContext) -> None:
    from datasets import Dataset
    from trl import GRPOConfig

    from distill.methods.callbacks import DistillCallback, quiet, trainer_common_args

    cfg = ctx.config
    if ctx.student.tokenizer.get_vocab() != ctx.teacher.tokenizer.get_vocab():
        raise ValueError(
            "opd needs student and teacher to share a tokenizer (the teacher scores the student's token "
            f"ids); {cfg.student.name} and {cfg.teacher.name} differ. Use --method rose for cross-family pairs."
        )
    items = ctx.domain.train_items()
    ctx.extras["items"] = items
    rows = [{"prompt": ctx.student.render(item.prompt), "item_index": i} for i, item in enumerate(items)]
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.num_generations
    args = GRPOConfig(
        **trainer_common_args(ctx),
        per_device_train_batch_size=per_step,
        num_generations=cfg.rollout.num_generations,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        beta=0.0,
        scale_rewards="none",
        loss_type="dapo",
        num_iterations=1,
        mask_truncated_completions=False,
        shuffle_dataset=True,
        log_completions=False,
    )
    trainer_cls = make_trainer_class()
    trainer = trainer_cls(
        model=ctx.student.model,
        reward_funcs=[_zero_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=ctx.student.tokenizer,
        callbacks=[DistillCallback(ctx)],
    )
    trainer.distill_ctx = ctx
    quiet(trainer).train(resume_from_checkpoint=str(ctx.resume_from) if ctx.resume_from else None)
    ctx.student.model = trainer.model
