"""The loss side of an on-policy step: the teacher's signal on the student's own forward.

The student's logprobs come from the training forward itself: for `token_reward_direct` GRPO's
per-token logps forward (`Signal.set_advantages` fills in the advantages GRPO's loss is about to
read), for the divergence losses their own forward (`Signal.divergence_loss`). So a step runs one
student forward with gradient and no second, scoring one, and the advantage

    A_t = coef * (logp_teacher_t - logp_student_t)

uses the student's logprobs of the weights being trained (on-policy, one iteration per batch,
they are the weights that sampled it). Both paths apply the student's head per chunk of
completion positions (kernels/heads.py), never [B, T, vocab]; the step's `kl/` figures sum over
its micro-batches (scoring.KLMeter).

Temperature: the signal compares the two models as they are, both at temperature 1, whatever
`rollout.temperature` the rollouts were sampled at. The temperature only chooses which states are
visited. A student at temperature 1 equal to the teacher at 1 is equal to it at every temperature,
which no tempered comparison gives; and a tempered student against an untempered teacher would
measure a distance to neither model. GRPO's own policy-gradient logps (token_reward_direct) stay
at the sampling temperature, as TRL computes them, so its importance ratios (vLLM's correction,
several iterations) compare like with like.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from distill.config import OnPolicyKL
from distill.kernels import losses
from distill.kernels.heads import head_gather, head_gather_topk, head_module, select_positions, token_logprobs
from distill.kernels.jsd import chunked_jsd
from distill.kernels.sharded import head_call
from distill.kernels.states import decoder_states
from distill.launch import token_share
from distill.methods.cross_family import CrossFamily, group_advantages, group_divergence
from distill.methods.scoring import Figures, KLMeter, advantages, clipped, token_advantages

if TYPE_CHECKING:
    from distill.tracking.steplog import StepRecord


class Signal:
    """One run's loss-side state: its method, the step record, the cross-family groups (None:
    the same ids on both sides), the teacher's head for `jsd` and the step's `kl/` meter."""

    def __init__(
        self,
        method: OnPolicyKL,
        log: StepRecord,
        cross: CrossFamily | None = None,
        teacher_head: torch.nn.Module | None = None,
        parts: Sequence[str] = (),
    ) -> None:
        if method.loss == "jsd" and teacher_head is None:
            raise ValueError("method.loss=jsd needs the teacher's output head in this process")
        self.method = method
        self.log = log
        self.cross = cross
        self.teacher_head = teacher_head
        self.meter = KLMeter()
        # A run over several domains: each domain's figures too (`kl/<domain>/...`).
        self.part_meters = {part: KLMeter() for part in parts} if len(parts) > 1 else {}

    def _record(self, step: int, figures: Figures, inputs: dict[str, Any]) -> None:
        self.log.add(self.meter.record(step, figures))
        if not self.part_meters:
            return
        mask_B_T = inputs["completion_mask"].bool()
        domain_N = inputs["domain_index"][:, None].expand_as(mask_B_T)[mask_B_T]
        if figures.kept_N is not None:
            domain_N = domain_N[figures.kept_N]
        for index, (part, meter) in enumerate(self.part_meters.items()):
            mine = meter.record(step, figures.subset(domain_N == index))
            self.log.add({k.replace("kl/", f"kl/{part}/", 1): v for k, v in mine.items()})

    def set_advantages(self, step: int, inputs: dict[str, Any], student_B_T: torch.Tensor) -> None:
        """token_reward_direct: A_t = coef * (logp_T - logp_S) from the loss forward's own student
        logprobs, into the batch GRPO's loss is about to read; the step's `kl/` figures."""
        if self.cross is not None:  # per byte group (cross_family.py)
            inputs["advantages"], figures = group_advantages(
                self.method, self.cross.mode, inputs, student_B_T
            )
            self._record(step, figures, inputs)
            return
        adv_B_T, figures = token_advantages(
            self.method, inputs["teacher_logps"], student_B_T, inputs["completion_mask"]
        )
        inputs["advantages"] = adv_B_T
        self._record(step, figures, inputs)

    def divergence_loss(
        self, step: int, model: torch.nn.Module, head_model: torch.nn.Module, inputs: dict[str, Any]
    ) -> torch.Tensor:
        """The direct-divergence members of the loss family (kernels/losses.py) on the trainer's
        batch: the student's hidden states once (through `model`, the trainer's possibly wrapped
        module), the head of `head_model` (unwrapped) applied per chunk of completion positions;
        the sampled tokens' logprobs from the same pass give the step's `kl/` figures."""
        mask_B_T = inputs["completion_mask"].bool()
        hidden_N_H = select_positions(student_states(model, inputs), mask_B_T)
        # One head call for every pass of the step: a sharded head is gathered once (sharded.py).
        head = head_module(head_model)
        loss, figures = head_call(
            head_model,
            lambda hidden, weight, bias: self._divergence(hidden, (weight, bias), head, inputs),
            hidden_N_H,
        )
        self._record(step, figures, inputs)
        # The per-token mean over this process's tokens, rescaled so that the average the data
        # parallel wrapper takes over processes is the mean over every process's tokens.
        return loss * token_share(hidden_N_H.shape[0], loss.device)

    def _divergence(
        self,
        hidden_N_H: torch.Tensor,
        head: tuple[torch.Tensor, torch.Tensor | None],
        head_layer: torch.nn.Module,
        inputs: dict[str, Any],
    ) -> tuple[torch.Tensor, Figures]:
        """The loss (mean over this process's supervised tokens) and the step's figures, from the
        student's states at the completion positions and its head, whole: `head` its (weight,
        bias), `head_layer` the module holding them for the call."""
        method = self.method
        mask_B_T = inputs["completion_mask"].bool()
        if self.cross is not None:  # per byte group (cross_family.py); jsd is refused cross-family
            return group_divergence(method, self.cross.mode, head, hidden_N_H, inputs)
        sampled_N = inputs["completion_ids"][mask_B_T]
        teacher_N = inputs["teacher_logps"][mask_B_T]
        topk: dict[str, Any] = {}
        if method.loss == "jsd":
            assert self.teacher_head is not None
            teacher_N_H = select_positions(inputs["teacher_hidden"].to(mask_B_T.device), mask_B_T)
            student_head, teacher_head = losses.shared_rows(head_layer, self.teacher_head)
            loss = chunked_jsd(
                hidden_N_H,
                teacher_N_H.to(hidden_N_H.device, hidden_N_H.dtype),
                student_head,
                teacher_head,
                method.beta,
            )
            with torch.no_grad():
                logp_S_N = token_logprobs(hidden_N_H, *head, sampled_N)
        elif method.loss == "forward_kl_topk":
            loss, logp_S_N, topk = _topk_forward_kl(method, hidden_N_H, head, inputs, mask_B_T)
        else:
            gathered, lse_N = head_gather(hidden_N_H, *head, sampled_N[:, None])
            logp_S_N = gathered[:, 0] - lse_N
            per_token_N = losses.direct_kl_per_token(method.loss, logp_S_N, teacher_N)
            loss = per_token_N.sum() / max(per_token_N.numel(), 1)
        gap_N = teacher_N - logp_S_N.detach()
        adv_N = advantages(method, gap_N)
        return loss, Figures(-gap_N, adv_N, clipped(method, gap_N), **topk)


def _topk_forward_kl(
    method: OnPolicyKL,
    hidden_N_H: torch.Tensor,
    head: tuple[torch.Tensor, torch.Tensor | None],
    inputs: dict[str, Any],
    mask_B_T: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """KL(teacher || student) over the teacher's top-k (with its tail bucket): the loss, the
    sampled tokens' logprobs (detached) and the top-k figures, from one pass of the head."""
    sampled_N = inputs["completion_ids"][mask_B_T]
    teacher_ids_N_K = inputs["teacher_topk_ids"][mask_B_T]
    teacher_logps_N_K = inputs["teacher_topk_logps"][mask_B_T]
    # A teacher with more rows than the student may rank ids the student has no row for: their
    # mass goes to the tail bucket (gathered at id 0, weighted 0).
    mapped_N_K = teacher_ids_N_K < head[0].shape[0]
    ids_N_K1 = torch.cat([sampled_N[:, None], torch.where(mapped_N_K, teacher_ids_N_K, 0)], dim=1)
    gathered, lse_N, student_ids_N_K, _ = head_gather_topk(
        hidden_N_H, head[0], head[1], ids_N_K1, teacher_ids_N_K.shape[-1]
    )
    student_N_K = gathered[:, 1:] - lse_N[:, None]
    weight_N_K = mapped_N_K.to(student_N_K.dtype)
    per_token_N = losses.topk_forward_kl_per_token(
        student_N_K, teacher_logps_N_K, method.topk_tail, weight_N_K
    )
    loss = per_token_N.sum() / max(per_token_N.numel(), 1)
    with torch.no_grad():
        topk = {
            "topk_overlap": losses.topk_overlap(student_ids_N_K, teacher_ids_N_K),
            "student_topk_mass_N": (student_N_K.exp() * weight_N_K).sum(-1),
            "teacher_topk_mass_N": teacher_logps_N_K.exp().sum(-1),
        }
    return loss, (gathered[:, 0] - lse_N).detach(), topk


def student_states(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
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
