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

from distill.config import OnPolicyKL
from distill.engines.states import completion_states
from distill.methods import losses
from distill.methods.context import RunContext
from distill.methods.scoring import check_lengths, opd_advantages, unpad_rows

if TYPE_CHECKING:
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
    """`OPDTrainer`, a GRPOTrainer subclass (built on first use: importing trl takes ~30 s)."""
    from trl import GRPOTrainer

    class OPDTrainer(GRPOTrainer):
        """GRPOTrainer whose signal is the teacher's view of the student's own tokens."""

        distill_ctx: RunContext
        # How the teacher sees an item (OPD: the plain problem; OPSD: with a privileged solution).
        teacher_prompt: PromptFor
        preflight_done = False

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            return score_rollouts(self, inputs, out, time.perf_counter() - start)

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if self.distill_ctx.method_as(OnPolicyKL).loss == "token_reward_direct":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return divergence_loss(self, model, inputs)

    return OPDTrainer


def score_rollouts(
    trainer: Any, inputs: list[dict[str, Any]], out: dict[str, Any], gen_time: float
) -> dict[str, Any]:
    """The teacher's view of this step's rollouts into the trainer's batch: advantages (or the
    teacher's logprobs / top-k / hidden states for the divergence losses), metrics and samples."""
    ctx: RunContext = trainer.distill_ctx
    method = ctx.method_as(OnPolicyKL)
    completion_mask_B_T = out["completion_mask"]
    prompt_rows = unpad_rows(out["prompt_ids"], out["prompt_mask"])
    completion_rows = unpad_rows(out["completion_ids"], completion_mask_B_T)
    # Student and teacher logprobs come from the same scoring code (same padding, same
    # numerics), so a student identical to its teacher gets exactly zero advantage.
    student_rows = ctx.student.score(prompt_rows, completion_rows)
    t0 = time.perf_counter()
    items = [ctx.items[int(x["item_index"])] for x in inputs]
    teacher_prompts = [trainer.teacher_prompt(ctx.teacher, item) for item in items]
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
        out.update(_teacher_targets(ctx, method, teacher_prompts, completion_rows, out))
    teacher_time = time.perf_counter() - t0
    if ctx.config.preflight and not trainer.preflight_done:
        from distill.methods.preflight import check_first_batch

        check_first_batch(ctx.student, out, items, prompt_rows, completion_rows)
        trainer.preflight_done = True
    _log_rollouts(ctx, trainer.state.global_step + 1, items, prompt_rows, completion_rows, adv_B_T)
    ctx.log.add({**stats, "perf/gen_time_s": gen_time, "perf/teacher_time_s": teacher_time})
    return out


def _teacher_targets(
    ctx: RunContext,
    method: OnPolicyKL,
    teacher_prompts: list[list[int]],
    completion_rows: list[list[int]],
    out: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """What a divergence loss needs of the teacher beyond its sampled-token logprobs."""
    mask_B_T = out["completion_mask"]
    device, width = mask_B_T.device, mask_B_T.shape[1]
    if method.loss == "forward_kl_topk":
        # Engine-level, so a served teacher (prompt top-k logprobs) works as the hf one.
        top_ids, top_logps = ctx.teacher.score_topk(teacher_prompts, completion_rows, method.top_k)
        return {
            "teacher_topk_ids": _pad_width(top_ids, width).to(device),
            "teacher_topk_logps": _pad_width(top_logps, width).to(device),
        }
    if method.loss == "jsd":
        teacher = ctx.local_teacher()
        tp_ids, tp_mask = teacher.left_pad(teacher_prompts)
        with torch.no_grad():
            hidden = completion_states(
                teacher.model, tp_ids.to(device), tp_mask.to(device), out["completion_ids"], mask_B_T
            )
        return {"teacher_hidden": hidden}
    return {}


def _log_rollouts(
    ctx: RunContext,
    step: int,
    items: list[Any],
    prompt_rows: list[list[int]],
    completion_rows: list[list[int]],
    adv_B_T: torch.Tensor,
) -> None:
    """The student's side of the step: lengths, truncation, reward, accuracy; a few samples."""
    texts = ctx.student.tokenizer.batch_decode(completion_rows, skip_special_tokens=True)
    eos = set(ctx.student.eos_ids)
    truncated = [not (row and row[-1] in eos) for row in completion_rows]
    scores = ctx.domain.score_batch(items, texts)
    lengths = [len(c) for c in completion_rows]
    ctx.log.add(
        {
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
        step,
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


def divergence_loss(trainer: Any, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """The direct-divergence members of the loss family on the trainer's batch (losses.py)."""
    ctx: RunContext = trainer.distill_ctx
    method = ctx.method_as(OnPolicyKL)
    mask_B_T = inputs["completion_mask"]
    hidden_B_T_H = _student_states(model, inputs)
    head = trainer.accelerator.unwrap_model(model).get_output_embeddings()
    if method.loss == "jsd":
        teacher_head = ctx.local_teacher().model.get_output_embeddings()
        return losses.jsd_loss(
            hidden_B_T_H, inputs["teacher_hidden"], head, teacher_head, mask_B_T, method.beta
        )
    logprobs_B_T_V = torch.log_softmax(head(hidden_B_T_H).float(), dim=-1)
    if method.loss == "forward_kl_topk":
        per_token_B_T = losses.topk_forward_kl_per_token(
            logprobs_B_T_V, inputs["teacher_topk_ids"], inputs["teacher_topk_logps"], method.topk_tail
        )
        overlap = losses.topk_overlap(logprobs_B_T_V.detach(), inputs["teacher_topk_ids"], mask_B_T)
        ctx.log.add({"kl/topk_overlap": overlap})
    else:
        logp_S_B_T = logprobs_B_T_V.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        per_token_B_T = losses.direct_kl_per_token(method.loss, logp_S_B_T, inputs["teacher_logps"])
    return losses.masked_mean(per_token_B_T, mask_B_T)


def train_on_policy(ctx: RunContext, teacher_prompt: PromptFor, callbacks: Sequence[Any] = ()) -> None:
    """The loop OPD and OPSD share; they differ in the teacher and how it sees the problem."""
    from datasets import Dataset
    from trl import GRPOConfig

    from distill.engines import vllm as vllm_engine
    from distill.launch import per_device, sharded
    from distill.methods.callbacks import DistillCallback, quiet, trainer_common_args

    cfg = ctx.config
    loss = ctx.method_as(OnPolicyKL).loss
    if sharded() and loss != "token_reward_direct":
        # The divergence losses apply the student's head outside the wrapper's forward, where
        # ZeRO-3 / FSDP hold only a shard of it.
        raise ValueError(
            f"method.loss={loss} trains in several processes with DDP only, not DeepSpeed or "
            "FSDP; use method.loss=token_reward_direct (TRL's GRPO loss) or configs/accelerate/ddp.yaml"
        )
    items = ctx.items = ctx.domain.train_items()
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
