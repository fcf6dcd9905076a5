"""On-policy distillation (OPD) on a TRL `GRPOTrainer` subclass: the core OPSD reuses too.

The student samples (TRL's own generation path, so vLLM works where TRL's does); the teacher
scores the *same* token ids. With the default loss the per-token advantage is

    A_t = coef * (logp_teacher_t - logp_student_t)        (token_reward_direct: not normalised)

and TRL's importance-sampled policy-gradient loss is applied on completion tokens only (the
prompt is never in the loss); the student's logprobs in A_t come from that loss's own forward
(on_policy.py). The other members of the loss family (`method.loss`, see kernels/losses.py) replace that
loss with a direct divergence on the same batch. Student tokens, student logprobs and teacher
logprobs must have equal lengths per sample; a mismatch is an error.

Cross-family pairs (the tokenizers differ) take the byte-aligned path (cross_family.py,
docs/cross_family.md): the teacher scores the student's text in its own tokens and the signal is
per byte group; `jsd` (one shared vocabulary) is refused there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from distill.config import OnPolicyKL, OPDMethod
from distill.kernels.states import completion_logprobs
from distill.methods import on_policy
from distill.methods.context import RunContext

if TYPE_CHECKING:
    from distill.methods.async_teacher import AsyncTeacher
    from distill.methods.cross_family import CrossFamily
    from distill.methods.preflight import PromptFor


def _zero_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    # The signal is the teacher's per-token view, set in _generate_and_score_completions.
    return [0.0] * len(completions)


def make_trainer_class() -> type:
    """`OPDTrainer`, a GRPOTrainer subclass (built on first use: importing trl takes ~30 s)."""
    from trl import GRPOTrainer

    class OPDTrainer(GRPOTrainer):
        """GRPOTrainer whose signal is the teacher's view of the student's own tokens."""

        distill_ctx: RunContext
        teacher_prompt: PromptFor  # OPD: the plain problem; OPSD: with a privileged solution
        preflight_done = False
        # token_reward_direct: the batch whose advantages the next logps forward fills in.
        _advantage_inputs: dict[str, Any] | None = None
        pipeline: AsyncTeacher | None = None  # rollout.async_teacher (async_teacher.py)
        cross: CrossFamily | None = None  # cross-family byte groups (cross_family.py); None: same ids
        _generate_single_turn = _sample_rollouts  # rollouts from the lean sampler where it applies

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            if self.pipeline is not None:
                return self.pipeline.step(self, inputs, self._rollouts)
            out, gen_time = self._rollouts(inputs)
            return on_policy.teacher_batch(self, inputs, out, gen_time)

        def _rollouts(self, inputs: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
            """GRPO's rollouts (its generation and bookkeeping) and their wall time."""
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            return out, time.perf_counter() - start

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            fetch = super().get_batch_samples
            if self.pipeline is None:
                return fetch(epoch_iterator, num_batches, device)
            return self.pipeline.lookahead(epoch_iterator, lambda: fetch(epoch_iterator, num_batches, device))

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if self.distill_ctx.method_as(OnPolicyKL).loss != "token_reward_direct":
                return on_policy.divergence_loss(self, model, inputs)
            # GRPO's own loss; its logps forward below also gives the student's side of A_t.
            self._advantage_inputs = inputs
            try:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            finally:
                self._advantage_inputs = None

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **multimodal: Any,
        ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
            """GRPO's per-token logps through distill's chunked head; in the loss, the same
            forward's logps (at temperature 1) are the student's side of the advantage."""
            if compute_aux_loss or any(v is not None for v in multimodal.values()):
                raise NotImplementedError("distill's OPD scores text-only, dense models (no MoE aux loss)")
            pending = self._advantage_inputs
            logps, entropies, plain = completion_logprobs(
                model,
                self.accelerator.unwrap_model(model),
                input_ids,
                attention_mask,
                logits_to_keep,
                self.temperature,
                untempered=pending is not None,
            )
            if pending is not None:
                on_policy.set_advantages(self, pending, logps.detach() if plain is None else plain)
            return logps, (entropies if compute_entropy else None), None

    return OPDTrainer


def _sample_rollouts(
    trainer: Any,
    prompt_ids: list[list[int]],
    images: Any,
    multimodal_fields: dict[str, Any],
    num_generations: int,
    has_tool_images: bool = False,
) -> tuple[list[list[int]], Any]:
    """OPDTrainer's `_generate_single_turn`: text rollouts from the lean sampler where it
    applies, else GRPO's own (vLLM or `generate`)."""
    from trl import GRPOTrainer

    if images is None and not multimodal_fields and not has_tool_images:
        completions = lean_rollouts(trainer, prompt_ids)
        if completions is not None:
            return completions, None
    return GRPOTrainer._generate_single_turn(
        trainer, prompt_ids, images, multimodal_fields, num_generations, has_tool_images
    )


def lean_rollouts(trainer: Any, prompt_ids: list[list[int]]) -> list[list[int]] | None:
    """The rollouts' completion ids (each cut after its EOS) sampled by engines/batched.py, whose
    decode steps skip the transformers call for the llama family: the sampling `generate` does
    (temperature, then top-p) at about 0.7x its time on the embedded student. None where that
    path does not apply (vLLM, LoRA, another model family): TRL's `generate` then samples."""
    from trl.models import unwrap_model_for_generation

    from distill.engines.batched import continue_many
    from distill.engines.decode import lean_decoder

    engine = trainer.distill_ctx.student
    if trainer.use_vllm or trainer.use_transformers_continuous_batching or lean_decoder(engine.model) is None:
        return None
    if set(engine.eos_ids) != set(trainer.eos_token_ids):
        return None
    n = len(prompt_ids)
    with unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        generation_kwargs=trainer.generation_kwargs,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    ) as model:
        if model is not engine.model:  # a wrapper that is not the engine's own module
            return None
        budget = trainer.max_completion_length
        out = continue_many(engine, prompt_ids, [None] * n, [budget] * n, trainer.temperature, trainer.top_p)
    return None if out is None else [completion.ids for completion, _ in out]


def train_on_policy(
    ctx: RunContext,
    teacher_prompt: PromptFor,
    callbacks: Sequence[Any] = (),
    cross: CrossFamily | None = None,
) -> None:
    """The loop OPD and OPSD share; they differ in the teacher and how it sees the problem
    (`cross`: the teacher scores the student's text in its own tokens, OPD only)."""
    pipeline = None
    if ctx.config.rollout.async_teacher:
        from distill.methods.async_teacher import AsyncTeacher

        # Started first: the teacher's worker loads while trl imports and the trainer is set up.
        pipeline = AsyncTeacher(ctx)
    try:
        _train_on_policy(ctx, teacher_prompt, callbacks, cross, pipeline)
    finally:
        if pipeline is not None:
            pipeline.close()


def _train_on_policy(
    ctx: RunContext,
    teacher_prompt: PromptFor,
    callbacks: Sequence[Any],
    cross: CrossFamily | None,
    pipeline: AsyncTeacher | None,
) -> None:
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
        callbacks=[DistillCallback(ctx), *callbacks, *ctx.callbacks],
        peft_config=lora_config(cfg),
    )
    trainer.distill_ctx = ctx
    trainer.teacher_prompt = teacher_prompt
    trainer.cross = cross
    trainer.pipeline = pipeline
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
    from distill.methods.cross_family import CrossFamily, refusal
    from distill.tokenizer_bridge.bridge import same_tokenizer

    cfg = ctx.config
    method = ctx.method_as(OPDMethod)
    cross = None
    if method.cross_family == "always" or not same_tokenizer(ctx.student.tokenizer, ctx.teacher.tokenizer):
        reason = refusal(method, cfg.student.name, cfg.teacher.name)
        if reason:
            raise ValueError(reason)
        cross = CrossFamily(ctx.student.tokenizer, ctx.teacher.tokenizer, method)
    train_on_policy(ctx, plain_prompt, cross=cross)


def plain_prompt(engine: Any, item: Any) -> list[int]:
    return list(engine.prompt_ids(item.prompt))
