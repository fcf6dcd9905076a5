"""On-policy distillation (OPD) on a TRL `GRPOTrainer` subclass: the core OPSD reuses too.

The student samples (TRL's own generation path, so vLLM works where TRL's does); the teacher
scores the *same* token ids. With the default loss the per-token advantage is

    A_t = coef * (logp_teacher_t - logp_student_t)        (token_reward_direct: not normalised)

and TRL's importance-sampled policy-gradient loss is applied on completion tokens only (the
prompt is never in the loss). The other members of the loss family (`method.loss`, see
losses.py) replace that loss with a direct divergence on the same batch. Student tokens, student
logprobs and teacher logprobs must have equal lengths per sample; a mismatch is an error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from distill.methods import losses
from distill.methods.context import RunContext
from distill.methods.scoring import check_lengths, completion_states, opd_advantages, unpad_rows

if TYPE_CHECKING:
    from distill.config import OnPolicyKL
    from distill.methods.preflight import PromptFor


def _zero_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    # The signal is the teacher's per-token view, set in _generate_and_score_completions.
    return [0.0] * len(completions)


def _right_pad(rows: Sequence[Sequence[float]], shape: torch.Size) -> torch.Tensor:
    out_B_T = torch.zeros(shape, dtype=torch.float32)
    for i, row in enumerate(rows):
        out_B_T[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out_B_T


def _pad_width(values_B_T_K: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad (or check) the time axis to the trainer's completion width."""
    have = values_B_T_K.shape[1]
    if have > width:
        raise ValueError(f"teacher top-k covers {have} completion positions but the batch has {width}")
    return torch.nn.functional.pad(values_B_T_K, (0, 0, 0, width - have))


def _student_states(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """The student's final hidden states at the completion positions, for the divergence losses.

    One process: the decoder alone (`completion_states`). Several: through the DDP wrapper's own
    forward, or DDP would not average the gradients; its `hidden_states[-1]` is bitwise the
    decoder's last_hidden_state (transformers 5), and `logits_to_keep=1` keeps the head off the
    sequence (the loss applies it).
    """
    from distill.launch import world_size

    prompt_B_P, mask_B_T = inputs["prompt_ids"], inputs["completion_mask"]
    if world_size() == 1:
        return completion_states(model, prompt_B_P, inputs["prompt_mask"], inputs["completion_ids"], mask_B_T)
    out = model(
        input_ids=torch.cat([prompt_B_P, inputs["completion_ids"]], dim=1),
        attention_mask=torch.cat([inputs["prompt_mask"], mask_B_T], dim=1),
        output_hidden_states=True,
        logits_to_keep=1,
        use_cache=False,
    )
    width_P, width_T = prompt_B_P.shape[1], mask_B_T.shape[1]
    return out.hidden_states[-1][:, width_P - 1 : width_P - 1 + width_T]


def make_trainer_class() -> type:
    from trl import GRPOTrainer

    class OPDTrainer(GRPOTrainer):
        """GRPOTrainer whose signal is the teacher's view of the student's own tokens."""

        distill_ctx: RunContext
        # How the teacher sees an item (OPD: the plain problem; OPSD: with a privileged solution).
        teacher_prompt: PromptFor
        preflight_done = False

        @property
        def kl_config(self) -> OnPolicyKL:
            return self.distill_ctx.config.method  # type: ignore[return-value]

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            ctx = self.distill_ctx
            method = self.kl_config
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
            teacher_prompts = [self.teacher_prompt(ctx.teacher, item) for item in items]
            teacher_rows = ctx.teacher.score(teacher_prompts, completion_rows)
            check_lengths(completion_rows, student_rows, teacher_rows)

            adv_B_T, stats = opd_advantages(
                teacher_rows, student_rows, completion_mask_B_T.shape, method.coef, method.advantage_clip
            )
            device = completion_mask_B_T.device
            if method.loss == "token_reward_direct":
                out["advantages"] = adv_B_T.to(device) * completion_mask_B_T
            else:
                out["advantages"] = torch.zeros_like(completion_mask_B_T, dtype=torch.float32)
                out["teacher_logps"] = _right_pad(teacher_rows, completion_mask_B_T.shape).to(device)
                if method.loss == "forward_kl_topk":
                    # Engine-level, so a served teacher (prompt top-k logprobs) works as the hf one.
                    top_ids, top_logps = ctx.teacher.score_topk(
                        teacher_prompts, completion_rows, method.top_k
                    )
                    width = completion_mask_B_T.shape[1]
                    out["teacher_topk_ids"] = _pad_width(top_ids, width).to(device)
                    out["teacher_topk_logps"] = _pad_width(top_logps, width).to(device)
                elif method.loss == "jsd":
                    tp_ids, tp_mask = ctx.teacher.left_pad(teacher_prompts)
                    with torch.no_grad():
                        out["teacher_hidden"] = completion_states(
                            ctx.teacher.model,
                            tp_ids.to(device),
                            tp_mask.to(device),
                            out["completion_ids"],
                            completion_mask_B_T,
                        )
            teacher_time = time.perf_counter() - t0
            if ctx.config.preflight and not self.preflight_done:
                self._preflight_first_batch(out, items, prompt_rows, completion_rows)

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

        def _preflight_first_batch(
            self,
            out: dict[str, Any],
            items: list[Any],
            prompt_rows: list[list[int]],
            completion_rows: list[list[int]],
        ) -> None:
            """On the real first batch: masks, and the trainer's prompt ids equal the teacher path's."""
            from distill.methods.preflight import (
                SELF_SCORE_TOLERANCE,
                PreflightError,
                check_loss_mask,
                self_score_gap,
            )

            student = self.distill_ctx.student
            check_loss_mask(
                out["prompt_ids"],
                out["prompt_mask"],
                out["completion_ids"],
                out["completion_mask"],
                out["advantages"],
                prompt_rows,
            )
            gap = self_score_gap(
                student, prompt_rows, [student.prompt_ids(it.prompt) for it in items], completion_rows
            )
            if gap > SELF_SCORE_TOLERANCE:
                raise PreflightError(
                    f"self-score on the first batch: the trainer's prompt ids and the teacher path's differ "
                    f"(max logprob gap {gap:.3g} with the student as its own teacher)"
                )
            self.preflight_done = True

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if self.kl_config.loss == "token_reward_direct":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return self._divergence_loss(model, inputs)

        def _divergence_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
            method = self.kl_config
            mask_B_T = inputs["completion_mask"]
            hidden_B_T_H = _student_states(model, inputs)
            head = self.accelerator.unwrap_model(model).get_output_embeddings()
            if method.loss == "jsd":
                teacher_head = self.distill_ctx.teacher.model.get_output_embeddings()
                return losses.jsd_loss(
                    hidden_B_T_H, inputs["teacher_hidden"], head, teacher_head, mask_B_T, method.beta
                )
            logprobs_B_T_V = torch.log_softmax(head(hidden_B_T_H).float(), dim=-1)
            if method.loss == "forward_kl_topk":
                per_token_B_T = losses.topk_forward_kl_per_token(
                    logprobs_B_T_V, inputs["teacher_topk_ids"], inputs["teacher_topk_logps"], method.topk_tail
                )
                self.distill_ctx.log.add(
                    {
                        "kl/topk_overlap": losses.topk_overlap(
                            logprobs_B_T_V.detach(), inputs["teacher_topk_ids"], mask_B_T
                        )
                    }
                )
            else:
                logp_S_B_T = logprobs_B_T_V.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
                per_token_B_T = losses.direct_kl_per_token(method.loss, logp_S_B_T, inputs["teacher_logps"])
            return losses.masked_mean(per_token_B_T, mask_B_T)

    return OPDTrainer


def train_on_policy(ctx: RunContext, teacher_prompt: PromptFor, callbacks: Sequence[Any] = ()) -> None:
    """The loop OPD and OPSD share; they differ in the teacher and how it sees the problem."""
    from datasets import Dataset
    from trl import GRPOConfig

    from distill.engines import vllm as vllm_engine
    from distill.launch import per_device, sharded
    from distill.methods.callbacks import DistillCallback, quiet, trainer_common_args

    cfg = ctx.config
    if sharded() and cfg.method.loss != "token_reward_direct":  # type: ignore[union-attr]
        # The divergence losses apply the student's head outside the wrapper's forward, where
        # ZeRO-3 / FSDP hold only a shard of it.
        raise ValueError(
            f"method.loss={cfg.method.loss} trains in several processes with DDP only, not DeepSpeed or "  # type: ignore[union-attr]
            "FSDP; use method.loss=token_reward_direct (TRL's GRPO loss) or configs/accelerate/ddp.yaml"
        )
    items = ctx.domain.train_items()
    ctx.extras["items"] = items
    # Conversational prompts: TRL renders them with the chat template and tokenises without adding
    # special tokens again, exactly as HFEngine.prompt_ids does for the teacher (see preflight).
    rows = [
        {"prompt": [{"role": "user", "content": item.prompt}], "item_index": i}
        for i, item in enumerate(items)
    ]
    thinking = ctx.student.enable_thinking
    args = GRPOConfig(
        **trainer_common_args(ctx),
        # rollout.prompts_per_step is the global batch, split over the training processes.
        per_device_train_batch_size=per_device(cfg.rollout.prompts_per_step, "rollout.prompts_per_step")
        * cfg.rollout.num_generations,
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
        chat_template_kwargs={} if thinking is None else {"enable_thinking": thinking},
        **vllm_engine.trainer_args(cfg.rollout),
    )
    trainer = make_trainer_class()(
        model=ctx.student.model,
        reward_funcs=[_zero_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=ctx.student.tokenizer,
        callbacks=[DistillCallback(ctx), *callbacks],
        peft_config=lora_config(cfg),
    )
    trainer.distill_ctx = ctx
    trainer.teacher_prompt = teacher_prompt
    quiet(trainer).train(resume_from_checkpoint=str(ctx.resume_from) if ctx.resume_from else None)
    model = trainer.model
    if cfg.lora.enabled:
        # Evals and the final checkpoint see plain weights; the adapters live in step-N folders.
        model = model.merge_and_unload()
    ctx.student.model = model


def lora_config(cfg: Any) -> Any:
    if not cfg.lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.targets),
        task_type="CAUSAL_LM",
    )


def train(ctx: RunContext) -> None:
    cfg = ctx.config
    if ctx.student.tokenizer.get_vocab() != ctx.teacher.tokenizer.get_vocab():
        raise ValueError(
            "opd needs student and teacher to share a tokenizer (the teacher scores the student's token "
            f"ids); {cfg.student.name} and {cfg.teacher.name} differ. Use --method rose for cross-family pairs."
        )
    train_on_policy(ctx, plain_prompt)


def plain_prompt(engine: Any, item: Any) -> list[int]:
    return list(engine.prompt_ids(item.prompt))
