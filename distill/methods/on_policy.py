"""The step core OPD and OPSD share on their GRPOTrainer: the teacher's view of the rollouts, and
the student's side computed inside the loss's own forward.

At generation time the teacher scores the student's sampled ids (its logprobs, and its top-k or
hidden states where the loss needs them); that is all. The student's logprobs come from the
training forward itself: for `token_reward_direct` GRPO's per-token logps forward (one more head
pass at temperature 1 when sampling ran at another), for the divergence losses their own forward.
So a step runs one student forward with gradient and no second, scoring one, and the advantage

    A_t = coef * (logp_teacher_t - logp_student_t)

uses the student's logprobs of the weights being trained (on-policy, one iteration per batch,
they are the weights that sampled it). The `kl/` figures sum over a step's micro-batches.

Temperature: the signal compares the two models as they are, both at temperature 1, whatever
`rollout.temperature` the rollouts were sampled at (the presets sample at 0.5). The temperature
only chooses which states are visited. A student at temperature 1 equal to the teacher at 1 is
equal to it at every temperature, which no tempered comparison gives; and a tempered student
against an untempered teacher would measure a distance to neither model. GRPO's own policy-
gradient logps (token_reward_direct) stay at the sampling temperature, as TRL computes them, so
its importance ratios (vLLM's correction, several iterations) compare like with like.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from distill.config import OnPolicyKL
from distill.kernels.heads import head_gather, head_gather_topk, output_head, select_positions, token_logprobs
from distill.kernels.states import decoder_states
from distill.kernels import losses
from distill.methods.scoring import check_lengths, unpad_rows

if TYPE_CHECKING:
    from distill.engines.base import TokenScores
    from distill.methods.context import RunContext
    from distill.methods.cross_family import CrossFamily
    from distill.tokenizer_bridge.granularity import AlignedSample


class KLMeter:
    """The step's `kl/` figures over all its micro-batches (a step may accumulate several)."""

    def __init__(self) -> None:
        self.step = -1
        self.n = 0
        self.total = self.squares = self.advantage = 0.0

    def add(
        self, step: int, reverse_kl_N: torch.Tensor, advantage_sum: torch.Tensor | None = None
    ) -> dict[str, float]:
        if step != self.step:
            self.step, self.n, self.total, self.squares, self.advantage = step, 0, 0.0, 0.0, 0.0
        values = reverse_kl_N.detach().double()
        self.n += values.numel()
        self.total += float(values.sum())
        self.squares += float((values * values).sum())
        n = max(self.n, 1)
        mean = self.total / n
        var = (self.squares - n * mean * mean) / (n - 1) if self.n > 1 else 0.0
        stats = {"kl/reverse_kl_mean": mean, "kl/reverse_kl_std": math.sqrt(max(var, 0.0))}
        if advantage_sum is not None:
            self.advantage += float(advantage_sum)
            stats["kl/advantage_mean"] = self.advantage / n
        return stats


def meter(trainer: Any) -> KLMeter:
    if not hasattr(trainer, "_kl_meter"):
        trainer._kl_meter = KLMeter()
    m: KLMeter = trainer._kl_meter
    return m


@dataclass
class Rollouts:
    """One step's rollouts as GRPO produced them, with what the teacher needs to score them."""

    inputs: list[dict[str, Any]]
    out: dict[str, Any]
    items: list[Any]
    prompt_rows: list[list[int]]
    completion_rows: list[list[int]]
    teacher_prompts: list[list[int]]
    gen_time: float
    # Cross-family (cross_family.py): each completion in the teacher's tokens, with its byte groups.
    aligned: list[AlignedSample] | None = None

    @property
    def teacher_rows(self) -> list[list[int]]:
        """The completions as the teacher scores them: the student's own ids, or crossed ones."""
        return self.completion_rows if self.aligned is None else [s.teacher_ids for s in self.aligned]


def rollouts(trainer: Any, inputs: list[dict[str, Any]], out: dict[str, Any], gen_time: float) -> Rollouts:
    ctx: RunContext = trainer.distill_ctx
    items = [ctx.items[int(x["item_index"])] for x in inputs]
    completion_rows = unpad_rows(out["completion_ids"], out["completion_mask"])
    cross: CrossFamily | None = getattr(trainer, "cross", None)
    return Rollouts(
        inputs,
        out,
        items,
        unpad_rows(out["prompt_ids"], out["prompt_mask"]),
        completion_rows,
        # The teacher's prompt in its own chat template (cross-family: its own tokens too).
        [trainer.teacher_prompt(ctx.teacher, item) for item in items],
        gen_time,
        None if cross is None else cross.align(completion_rows),
    )


def score_teacher(ctx: RunContext, scorer: Any, batch: Rollouts) -> TokenScores:
    """The teacher's view of the sampled ids: its logprobs, and its top-k (forward_kl_topk) or
    hidden states (jsd) from the same pass: one teacher forward per step. `scorer` is the
    teacher's engine (or its worker process, rollout.async_teacher)."""
    method = ctx.method_as(OnPolicyKL)
    if method.loss == "jsd":
        return scorer.score(batch.teacher_prompts, batch.teacher_rows, states=True)
    # Cross-family: the top-k also says what could extend each token (tokenizer_bridge/boundary.py).
    top_k = method.top_k if method.loss == "forward_kl_topk" or batch.aligned is not None else 0
    return scorer.score(batch.teacher_prompts, batch.teacher_rows, top_k=top_k)


def teacher_batch(
    trainer: Any, inputs: list[dict[str, Any]], out: dict[str, Any], gen_time: float
) -> dict[str, Any]:
    """The synchronous step: score this step's rollouts now, then `with_teacher`."""
    ctx: RunContext = trainer.distill_ctx
    batch = rollouts(trainer, inputs, out, gen_time)
    t0 = time.perf_counter()
    teacher = score_teacher(
        ctx, ctx.local_teacher() if ctx.method_as(OnPolicyKL).loss == "jsd" else ctx.teacher, batch
    )
    return with_teacher(trainer, batch, teacher, {"perf/teacher_time_s": time.perf_counter() - t0})


def with_teacher(
    trainer: Any, batch: Rollouts, teacher: TokenScores, perf: dict[str, float]
) -> dict[str, Any]:
    """The teacher's view of the rollouts into the trainer's batch (its logprobs of the sampled
    ids; its top-k or hidden states where the loss needs them), the student's figures and
    samples. Advantages are set in the loss (`set_advantages`); GRPO's own are zeroed."""
    ctx: RunContext = trainer.distill_ctx
    out = batch.out
    mask_B_T = out["completion_mask"]
    out["advantages"] = torch.zeros_like(mask_B_T, dtype=torch.float32)
    cross: CrossFamily | None = getattr(trainer, "cross", None)
    if cross is not None and batch.aligned is not None:
        targets, figures = cross.targets(batch.aligned, teacher, mask_B_T)
        out.update(targets)
        ctx.log.add(figures)
    else:
        teacher = teacher.widened(mask_B_T.shape[1])
        check_lengths(mask_B_T, teacher)
        out["teacher_logps"] = teacher.logprobs_B_T.to(mask_B_T.device)
        out.update(_teacher_targets(ctx.method_as(OnPolicyKL), teacher, mask_B_T.device))
    if ctx.config.preflight and not trainer.preflight_done:
        from distill.methods.preflight import check_first_batch

        check_first_batch(ctx.student, out, batch.items, batch.prompt_rows, batch.completion_rows)
        trainer.preflight_done = True
    log_rollouts(ctx, trainer.state.global_step + 1, batch.items, batch.prompt_rows, batch.completion_rows)
    ctx.log.add({"perf/gen_time_s": batch.gen_time, **perf})
    return out


def _teacher_targets(
    method: OnPolicyKL, teacher: TokenScores, device: torch.device
) -> dict[str, torch.Tensor]:
    """What a divergence loss needs of the teacher beyond its sampled-token logprobs."""
    if method.loss == "forward_kl_topk":
        ids_B_T_K, logps_B_T_K = teacher.topk()
        return {"teacher_topk_ids": ids_B_T_K.to(device), "teacher_topk_logps": logps_B_T_K.to(device)}
    if method.loss == "jsd" and teacher.states_B_T_H is not None:
        return {"teacher_hidden": teacher.states_B_T_H.to(device)}
    return {}


def log_rollouts(
    ctx: RunContext,
    step: int,
    items: list[Any],
    prompt_rows: list[list[int]],
    completion_rows: list[list[int]],
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
    rows = [
        {
            "prompt": items[i].prompt,
            "student": texts[i],
            "student_tokens": lengths[i],
            "truncated": truncated[i],
            "correct": scores[i].correct,
        }
        for i in range(min(ctx.config.tracking.sample_rows, len(items)))
    ]
    ctx.log.samples(step, rows)


def set_advantages(trainer: Any, inputs: dict[str, Any], student_B_T: torch.Tensor) -> None:
    """token_reward_direct: A_t = coef * (logp_T - logp_S) from the loss forward's own student
    logprobs, into the batch GRPO's loss is about to read; the step's `kl/` figures."""
    ctx: RunContext = trainer.distill_ctx
    method = ctx.method_as(OnPolicyKL)
    cross: CrossFamily | None = getattr(trainer, "cross", None)
    if cross is not None:  # per byte group (cross_family.py)
        from distill.methods.cross_family import group_advantages

        inputs["advantages"], reverse_kl_N, adv_sum = group_advantages(
            method, cross.mode, inputs, student_B_T
        )
        ctx.log.add(meter(trainer).add(trainer.state.global_step, reverse_kl_N, adv_sum))
        return
    mask_B_T = inputs["completion_mask"]
    gap_B_T = (inputs["teacher_logps"] - student_B_T) * mask_B_T
    adv_B_T = advantages(method, gap_B_T)
    inputs["advantages"] = adv_B_T * mask_B_T
    on = mask_B_T.bool()
    ctx.log.add(meter(trainer).add(trainer.state.global_step, -gap_B_T[on], adv_B_T[on].sum()))


def student_states(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """The student's final hidden states at the completion positions [B, T, H] (the loss applies
    the head itself, per chunk): prompts left-padded and completions right-padded, so the
    completion starts at one column in every row."""
    prompt_B_P, mask_B_T = inputs["prompt_ids"], inputs["completion_mask"]
    hidden_B_L_H = decoder_states(
        model,
        torch.cat([prompt_B_P, inputs["completion_ids"]], dim=1),
        torch.cat([inputs["prompt_mask"], mask_B_T], dim=1),
    )
    width_P, width_T = prompt_B_P.shape[1], mask_B_T.shape[1]
    return hidden_B_L_H[:, width_P - 1 : width_P - 1 + width_T]


def divergence_loss(trainer: Any, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """The direct-divergence members of the loss family on the trainer's batch (kernels/losses.py): the
    student's hidden states once, its head applied per chunk of completion positions; the sampled
    tokens' logprobs from the same pass give the step's `kl/` figures."""
    ctx: RunContext = trainer.distill_ctx
    method = ctx.method_as(OnPolicyKL)
    mask_B_T = inputs["completion_mask"].bool()
    hidden_B_T_H = student_states(model, inputs)
    student = trainer.accelerator.unwrap_model(model)
    hidden_N_H = select_positions(hidden_B_T_H, mask_B_T)
    weight, bias = output_head(student)
    cross: CrossFamily | None = getattr(trainer, "cross", None)
    if cross is not None:  # per byte group (cross_family.py); jsd is refused cross-family
        from distill.methods.cross_family import group_divergence

        loss, reverse_kl_N, adv_sum, overlap = group_divergence(
            method, cross.mode, (weight, bias), hidden_N_H, inputs
        )
        if overlap is not None:
            ctx.log.add({"kl/topk_overlap": overlap})
        ctx.log.add(meter(trainer).add(trainer.state.global_step, reverse_kl_N, adv_sum))
        return loss
    sampled_N = inputs["completion_ids"][mask_B_T]
    teacher_N = inputs["teacher_logps"][mask_B_T]
    if method.loss == "jsd":
        teacher_head = ctx.local_teacher().model.get_output_embeddings()
        loss = losses.jsd_loss(
            hidden_B_T_H,
            inputs["teacher_hidden"],
            student.get_output_embeddings(),
            teacher_head,
            mask_B_T,
            method.beta,
        )
        with torch.no_grad():
            logp_S_N = token_logprobs(hidden_N_H, weight, bias, sampled_N)
    elif method.loss == "forward_kl_topk":
        teacher_ids_N_K = inputs["teacher_topk_ids"][mask_B_T]
        ids_N_K1 = torch.cat([sampled_N[:, None], teacher_ids_N_K], dim=1)
        gathered, lse_N, student_ids_N_K, _ = head_gather_topk(
            hidden_N_H, weight, bias, ids_N_K1, teacher_ids_N_K.shape[-1]
        )
        per_token_N = losses.topk_forward_kl_per_token(
            gathered[:, 1:] - lse_N[:, None], inputs["teacher_topk_logps"][mask_B_T], method.topk_tail
        )
        loss = per_token_N.sum() / max(per_token_N.numel(), 1)
        logp_S_N = (gathered[:, 0] - lse_N).detach()
        ctx.log.add({"kl/topk_overlap": losses.topk_overlap(student_ids_N_K, teacher_ids_N_K)})
    else:
        gathered, lse_N = head_gather(hidden_N_H, weight, bias, sampled_N[:, None])
        logp_S_N = gathered[:, 0] - lse_N
        per_token_N = losses.direct_kl_per_token(method.loss, logp_S_N, teacher_N)
        loss = per_token_N.sum() / max(per_token_N.numel(), 1)
    gap_N = teacher_N - logp_S_N.detach()
    ctx.log.add(meter(trainer).add(trainer.state.global_step, -gap_N, advantages(method, gap_N).sum()))
    return loss


def advantages(method: OnPolicyKL, gap: torch.Tensor) -> torch.Tensor:
    """A = coef * (logp_T - logp_S), clamped to +-advantage_clip when set (never normalised)."""
    adv = method.coef * gap
    return adv if method.advantage_clip is None else adv.clamp(-method.advantage_clip, method.advantage_clip)
