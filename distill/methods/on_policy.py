"""The on-policy core OPD and OPSD share, on a TRL `GRPOTrainer`: rollouts -> teacher scores ->
targets -> loss, as explicit steps.

- rollouts: GRPO's own generation path (so vLLM works where TRL's does); on the hf engine the
  lean batched sampler through TRL's public `rollout_func` (engines/batched.py: the same
  sampling as `generate`, in less time; docs/results.md has the ratio);
- teacher scores and targets: `batch.Batches` (synchronously, or one step ahead through
  `async_teacher.AsyncTeacher`);
- loss: `signal.Signal`, in the loss's own forward.

TRL has no public hook for two of them, so `OnPolicyTrainer` overrides two private methods:
`_generate_and_score_completions` (the teacher's per-token view replaces GRPO's scalar rewards,
as DESIGN.md's building-blocks table prescribes) and `_get_per_token_logps_and_entropies` (GRPO's
logps forward through distill's chunked head: TRL's own head holds [4096 tokens, 32768 vocab]
fp32 tiles on CPU; its logps at temperature 1 are the student's side of the advantage).
Everything the trainer holds is declared in its `__init__`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

from distill.config import OnPolicyKL, Sampling
from distill.engines import vllm as vllm_engine
from distill.engines.batched import continue_many
from distill.engines.decode import lean_decoder
from distill.engines.worker import WorkerEngine
from distill.kernels.sharded import full_weights
from distill.kernels.states import completion_logprobs
from distill.launch import per_device
from distill.methods import alternate
from distill.methods.async_teacher import AsyncTeacher
from distill.methods.batch import Batches, Rollouts, TeacherSide, cut_out_of_vocab
from distill.methods.callbacks import DistillCallback, quiet, trainer_common_args
from distill.methods.signal import Signal
from distill.methods.targets import jsd_head

if TYPE_CHECKING:
    from distill.engines.hf import HFEngine
    from distill.methods.context import RunContext


def _zero_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    # The signal is the teacher's per-token view, set in _generate_and_score_completions.
    return [0.0] * len(completions)


class LeanRollouts:
    """TRL's `rollout_func`: text rollouts from distill's lean batched sampler, each cut after
    its EOS; the prompts rendered and tokenised in one call, as TRL's own path does. `sampling`
    is the one GRPOConfig was built from (`grpo_args`)."""

    def __init__(self, engine: HFEngine, sampling: Sampling, chat_template_kwargs: dict[str, Any]) -> None:
        self.engine = engine
        self.sampling = sampling
        self.chat_template_kwargs = chat_template_kwargs

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        tokenizer: Any = self.engine.tokenizer
        prompt_ids = tokenizer.apply_chat_template(
            conversation=prompts,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **self.chat_template_kwargs,
        )["input_ids"]
        n = len(prompt_ids)
        args = trainer.args
        assert isinstance(args, GRPOConfig)
        checkpointing: Any = args.gradient_checkpointing_kwargs
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=checkpointing,
        ) as model:
            if model is not self.engine.model:  # decided at set-up: see `lean_applies`
                raise RuntimeError("lean rollouts: the trainer's model is not the student engine's")
            budget = self.sampling.max_new_tokens
            out = continue_many(self.engine, prompt_ids, [None] * n, [budget] * n, self.sampling)
        if out is None:
            raise RuntimeError("lean rollouts: the student's cache cannot be stacked")
        return {"prompt_ids": prompt_ids, "completion_ids": [c.ids for c, _ in out], "logprobs": None}


def lean_applies(ctx: RunContext) -> bool:
    """Whether the student's rollouts can come from the lean sampler: the hf engine, a model
    family it can step (engines/decode.py), no LoRA wrapper and the EOS ids GRPO stops at."""
    cfg, engine = ctx.config, ctx.student
    if cfg.rollout.engine != "hf" or cfg.lora.enabled or lean_decoder(engine.model) is None:
        return False
    # GRPO stops at the generation config's EOS ids and the tokenizer's (GRPOTrainer.__init__).
    generation_eos = engine.model.generation_config.eos_token_id
    grpo_eos = {generation_eos} if isinstance(generation_eos, int) else set(generation_eos or [])
    return set(engine.eos_ids) == grpo_eos | {engine.tokenizer.eos_token_id}


class OnPolicyTrainer(GRPOTrainer):
    """GRPOTrainer whose signal is the teacher's view of the student's own tokens."""

    def __init__(
        self, ctx: RunContext, teachers: dict[str, TeacherSide], pipeline: AsyncTeacher | None, **kwargs: Any
    ) -> None:
        method = ctx.method_as(OnPolicyKL)
        self.ctx = ctx
        self.batches = Batches(ctx, teachers)
        head = None
        if method.loss == "jsd":  # one teacher: jsd is refused on several domains
            head = jsd_head(next(iter(teachers.values())).engine, ctx.student.model.device, ctx.say)
        self.signal = Signal(method, ctx.log, self.batches.cross, head, list(teachers))
        self.pipeline = pipeline
        self.direct = method.loss == "token_reward_direct"
        # token_reward_direct: the batch whose advantages the next logps forward fills in.
        self._advantage_inputs: dict[str, Any] | None = None
        # The run's first batch (this process's): preflight checks it with the student's own scores.
        self._first_batch = True
        # With domain.alternate: each step's lr over optim.lr (its domain's own), else None.
        self.lr_factors = alternate.lr_factors(ctx)
        self._alternating: torch.optim.lr_scheduler.LambdaLR | None = None
        super().__init__(**kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """optim.scheduler's schedule; with domain.alternate, each step's lr scaled to its domain's."""
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        factors = self.lr_factors
        if factors is None or scheduler is self._alternating:
            return scheduler
        self._alternating = self.lr_scheduler = alternate.scaled(scheduler, factors)
        return self.lr_scheduler

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # A sharded student is whole on every rank for the stretch in which it runs forwards of its
        # own (hf rollouts, the first batch's preflight self-score, OPSD's live teacher): each
        # rank's forwards are then its own, never collectives every rank would have to run in step
        # (kernels/sharded.py). vLLM rollouts scored by another model need no copy of it.
        assert self.model is not None
        first, self._first_batch = self._first_batch, False
        own = self.ctx.config.rollout.engine == "hf" or (first and self.ctx.config.preflight)
        own = own or any(side.engine is self.ctx.student for side in self.batches.teachers.values())
        with full_weights(self.model) if own else nullcontext(self.model):
            return self._batch(inputs)

    def _batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        step = self.state.global_step + 1
        if self.pipeline is not None:
            return self.pipeline.step(
                inputs,
                self.batches,
                self._rollouts,
                lambda batch, scores, perf: self.batches.targets(step, batch, scores, perf),
                not _last_before_checkpoint(self),
            )
        batch = self._rollouts(inputs)
        start = time.perf_counter()
        scored = self.batches.score({p: t.engine for p, t in self.batches.teachers.items()}, batch)
        perf = {"perf/teacher_time_s": time.perf_counter() - start}
        return self.batches.targets(step, batch, scored, perf)

    def _rollouts(self, inputs: list[dict[str, Any]]) -> Rollouts:
        """GRPO's rollouts (its generation and bookkeeping) with what the teacher needs; a
        completion is cut at an id outside the vocabulary (batch.cut_out_of_vocab)."""
        start = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        outside, tokens = cut_out_of_vocab(out, self.batches.vocab_limit)
        if outside:  # GRPO's loss normaliser counts the batch's supervised tokens
            out["num_items_in_batch"] = self.accelerator.gather(out["completion_mask"].sum()).sum()
        return self.batches.rollouts(inputs, out, time.perf_counter() - start, outside / max(tokens, 1))

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
        if not self.direct:
            step = self.state.global_step
            return self.signal.divergence_loss(step, model, self.accelerator.unwrap_model(model), inputs)
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
        """GRPO's per-token logps through distill's chunked head; in the loss, the same forward's
        logps (at temperature 1) are the student's side of the advantage."""
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
            student_B_T = logps.detach() if plain is None else plain
            self.signal.set_advantages(self.state.global_step, pending, student_B_T)
        return logps, (entropies if compute_entropy else None), None


def _last_before_checkpoint(trainer: GRPOTrainer) -> bool:
    """Whether this step is the run's last or ends in a checkpoint. Nothing is generated ahead
    then: a run resumed from that checkpoint starts with nothing in flight, and so does the run
    that was never stopped, so the two stay equal bit for bit (tests/e2e/test_kill_resume.py)."""
    step, args = trainer.state.global_step + 1, trainer.args
    if step >= trainer.state.max_steps:
        return True
    every = int(args.save_steps or 0) if args.save_strategy == "steps" else 0
    return every > 0 and step % every == 0


def train_on_policy(ctx: RunContext, teachers: dict[str, TeacherSide], callbacks: Sequence[Any] = ()) -> None:
    """The loop OPD and OPSD share; they differ in the teacher and how it sees the problem.
    `teachers`: a teacher per domain of the run (one for a one-domain run)."""
    pipeline = AsyncTeacher(teachers) if ctx.config.rollout.async_teacher else None
    try:
        _train(ctx, teachers, callbacks, pipeline)
    finally:
        if pipeline is not None:
            pipeline.close()
        # A teacher's worker process has scored its last batch: nothing after training asks it.
        for side in teachers.values():
            if isinstance(side.engine, WorkerEngine):
                side.engine.close()


def template_kwargs(ctx: RunContext) -> dict[str, Any]:
    """What the student's chat template is rendered with (its thinking mode, when set)."""
    thinking = ctx.student.enable_thinking
    return {} if thinking is None else {"enable_thinking": thinking}


def grpo_args(ctx: RunContext, sampling: Sampling) -> GRPOConfig:
    """GRPO's settings for an on-policy distillation run: one iteration per batch, no KL to a
    reference, no reward scaling; the rollouts drawn as `sampling` says (`rollout.*`)."""
    cfg = ctx.config
    return GRPOConfig(
        **trainer_common_args(ctx),
        # rollout.prompts_per_step is the global batch, split over the training processes.
        per_device_train_batch_size=per_device(cfg.rollout.prompts_per_step, "rollout.prompts_per_step")
        * cfg.rollout.num_generations,
        num_generations=cfg.rollout.num_generations,
        max_completion_length=sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0,
        beta=0.0,
        scale_rewards="none",
        loss_type="dapo",
        num_iterations=1,
        mask_truncated_completions=False,
        shuffle_dataset=True,
        log_completions=False,
        chat_template_kwargs=template_kwargs(ctx),
        # ZeRO-3: distill gathers the student itself for the whole rollout-and-scoring stretch
        # (OnPolicyTrainer._generate_and_score_completions); a second gather inside it would
        # release the weights on its way out.
        ds3_gather_for_generation=False,
        **vllm_engine.trainer_args(cfg.rollout),
    )


def _train(
    ctx: RunContext, teachers: dict[str, TeacherSide], callbacks: Sequence[Any], pipeline: AsyncTeacher | None
) -> None:
    cfg = ctx.config
    items = ctx.items = ctx.domain.train_items()
    # Conversational prompts: TRL renders them with the chat template and tokenises without adding
    # special tokens again, exactly as HFEngine.prompt_ids does for the teacher (see preflight).
    # domain.alternate: each step's prompts from its domain alone, in the plan's order (not shuffled).
    order = alternate.prompt_order(ctx, items)
    rows = [
        {"prompt": [{"role": "user", "content": items[i].prompt}], "item_index": i}
        for i in (range(len(items)) if order is None else order)
    ]
    sampling = cfg.rollout.sampling()
    args = grpo_args(ctx, sampling)
    args.shuffle_dataset = order is None
    with warnings.catch_warnings():
        # rollout_func is a public GRPOTrainer argument TRL still calls experimental.
        warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
        lean = LeanRollouts(ctx.student, sampling, template_kwargs(ctx)) if lean_applies(ctx) else None
        trainer = _trainer(ctx, teachers, callbacks, pipeline, args, rows, lean)
    quiet(trainer).train(resume_from_checkpoint=str(ctx.resume_from) if ctx.resume_from else None)
    model: Any = trainer.model
    if cfg.lora.enabled:
        # Evals and the final checkpoint see plain weights; the adapters live in step-N folders.
        model = model.merge_and_unload()
    ctx.student.model = model


def _trainer(
    ctx: RunContext,
    teachers: dict[str, TeacherSide],
    callbacks: Sequence[Any],
    pipeline: AsyncTeacher | None,
    args: GRPOConfig,
    rows: list[dict[str, Any]],
    lean: LeanRollouts | None,
) -> OnPolicyTrainer:
    return OnPolicyTrainer(
        ctx,
        teachers,
        pipeline,
        model=ctx.student.model,
        reward_funcs=[_zero_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=ctx.student.tokenizer,
        callbacks=[DistillCallback(ctx), *callbacks, *ctx.callbacks, *alternate.moments(ctx)],
        peft_config=lora_config(ctx),
        rollout_func=lean,
    )


def lora_config(ctx: RunContext) -> Any:
    """peft's LoraConfig of `lora.*`, or None to train every weight."""
    lora = ctx.config.lora
    if not lora.enabled:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.targets),
        task_type="CAUSAL_LM",
    )
