"""The OPD loss family on one rollout/scoring core (`method.loss`).

All variants see the same batch: student-sampled completion tokens, a completion mask, and the
teacher's view of the same token ids. They differ only in what they do with it:

- `token_reward_direct` (default): per-token advantage `A_t = coef * (logp_T - logp_S)` fed to
  TRL's importance-sampled policy-gradient loss (see opd.py); not a function here.
- `k1`: the sampled-token reverse-KL estimate `k1 = logp_S - logp_T` in its score-function form
  `sg(k1) * logp_S`, whose gradient is the reverse-KL gradient. (`k1` differentiated as it stands
  has gradient `grad logp_S`, zero in expectation and blind to the teacher.) No importance ratio,
  no clipping: the plain on-policy estimator beside `token_reward_direct`'s PPO-style loss.
- `k3` / `low_var_kl`: Schulman's low-variance estimate `exp(r) - r - 1`, `r = logp_T - logp_S`,
  clamped as verl clamps it. Its *value* estimates the reverse KL, but differentiated through the
  sampled tokens its gradient is the forward KL's (see `direct_kl_per_token`).
- `forward_kl_topk`: KL(teacher || student) over the teacher's top-k tokens, with the teacher's
  remaining mass matched against the student's remaining mass as one tail bucket.
- `jsd`: full-vocabulary generalised JSD (`beta` 0 forward KL, 1 reverse KL, TRL's convention),
  both heads applied per checkpointed chunk of positions, so the [B, T, V] logits of the two
  models are never materialised.

The functions here take per-token values at the scored positions only ([N] / [N, K], from the
chunked head); every reduction is a mean over completion tokens.
"""

from __future__ import annotations

from typing import Literal

import torch

from distill.kernels.heads import select_positions
from distill.kernels.jsd import chunked_jsd

LossName = Literal["token_reward_direct", "k1", "k3", "low_var_kl", "forward_kl_topk", "jsd"]
DIRECT_KL = ("k1", "k3", "low_var_kl")
# verl (`kl_penalty`, low_var_kl) clamps the log-ratio so exp() stays finite on outliers, and the
# final per-token value to [-10, 10] so one token the teacher finds far likelier cannot dominate.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def direct_kl_per_token(kind: str, logp_S_B_T: torch.Tensor, logp_T_B_T: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate on sampled tokens, differentiable through the student's logprobs.

    `k3` / `low_var_kl` is verl's: `r = clamp(logp_T - logp_S, -20, 20)`, value
    `clamp(exp(r) - r - 1, -10, 10)`. On tokens sampled from the student its value is an unbiased
    estimate of the reverse KL(student || teacher), but its gradient is not the reverse KL's:
    d k3 / d theta = (1 - p_T / p_S) grad logp_S, whose expectation under x ~ p_S is
    -sum_x p_T(x) grad logp_S(x) = grad KL(teacher || student), the *forward* KL's gradient (the
    sampling distribution itself is not differentiated). Where the clamp binds the gradient is 0.
    """
    if kind == "k1":
        return (logp_S_B_T - logp_T_B_T).detach() * logp_S_B_T
    if kind in ("k3", "low_var_kl"):
        r = (logp_T_B_T - logp_S_B_T).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return (torch.exp(r) - r - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    raise ValueError(f"method.loss: {kind!r} is not a direct KL estimate (one of {', '.join(DIRECT_KL)})")


def topk_forward_kl_per_token(
    student_logprobs_N_K: torch.Tensor,
    teacher_topk_logprobs_N_K: torch.Tensor,
    tail: bool = True,
    mapped_N_K: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(teacher || student) restricted to the teacher's top-k, plus a tail bucket.

    `student_logprobs_N_K` are the student's logprobs at the teacher's top-k ids (from one chunked
    pass over the head, `kernels.heads.head_gather`). Without the tail term the loss ignores the
    teacher mass outside its top-k, which rewards a student that puts all its mass on those k
    tokens even where the teacher is uncertain. `mapped_N_K` (1 or 0): the top-k entries the
    student can represent; the teacher's mass on the others joins the tail bucket (an id beyond
    the student's rows, a token of another vocabulary it lacks). All 1: the same numbers as None.
    """
    p_T_N_K = teacher_topk_logprobs_N_K.exp()
    p_S_N_K = student_logprobs_N_K.exp()
    if mapped_N_K is not None:
        p_T_N_K, p_S_N_K = p_T_N_K * mapped_N_K, p_S_N_K * mapped_N_K
    kl_N = (p_T_N_K * (teacher_topk_logprobs_N_K - student_logprobs_N_K)).sum(-1)
    if tail:
        eps = torch.finfo(student_logprobs_N_K.dtype).tiny
        tail_T_N = (1.0 - p_T_N_K.sum(-1)).clamp_min(0.0)
        tail_S_N = (1.0 - p_S_N_K.sum(-1)).clamp_min(eps)
        # 0 * log 0 = 0: a teacher with no tail mass contributes nothing.
        kl_N = kl_N + torch.where(
            tail_T_N > 0, tail_T_N * (tail_T_N.clamp_min(eps).log() - tail_S_N.log()), 0.0
        )
    return kl_N


def topk_overlap(student_topk_ids_N_K: torch.Tensor, teacher_topk_ids_N_K: torch.Tensor) -> float:
    """Mean share of the teacher's top-k tokens that are also in the student's top-k."""
    if not teacher_topk_ids_N_K.numel():
        return 0.0
    k = teacher_topk_ids_N_K.shape[-1]
    hits_N = (teacher_topk_ids_N_K.unsqueeze(-1) == student_topk_ids_N_K.unsqueeze(-2)).any(-1).sum(-1)
    return float((hits_N.float() / k).mean())


def jsd_loss(
    student_hidden_B_T_H: torch.Tensor,
    teacher_hidden_B_T_H: torch.Tensor,
    student_head: torch.nn.Module,
    teacher_head: torch.nn.Module,
    mask_B_T: torch.Tensor,
    beta: float,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Full-vocabulary generalised JSD over the masked positions, both heads applied per chunk of
    positions with checkpointed chunks (kernels/heads.py): never a [B, T, V] tensor. TRL's own
    chunked kernel holds ~1.7 GB of tiles on CPU at any length (benchmarks/scale_memory.py).

    Heads with different row counts (Qwen2.5: 151,936 up to 3B, 152,064 from 7B, one tokenizer)
    are compared over the rows both have: the rows past the shorter head are ids no tokenizer
    entry reaches, and each distribution is renormalised over the shared ones.

    Both heads must be where the student's hidden states are (a teacher's head elsewhere is
    copied there once, at set-up: methods/targets.py `jsd_head`); the teacher's hidden states
    are moved there with the batch."""
    mask = mask_B_T.bool()
    student_N_H = select_positions(student_hidden_B_T_H, mask)
    teacher_B_T_H = teacher_hidden_B_T_H.to(mask.device)
    teacher_N_H = select_positions(teacher_B_T_H, mask).to(student_N_H.device, student_N_H.dtype)
    return chunked_jsd(
        student_N_H, teacher_N_H, *shared_rows(student_head, teacher_head), beta, temperature=temperature
    )


Head = tuple[torch.Tensor, torch.Tensor | None]


def shared_rows(student_head: torch.nn.Module, teacher_head: torch.nn.Module) -> tuple[Head, Head]:
    """(weight, bias) of both output heads over the rows both have (all of them when equal)."""
    heads = []
    for head in (student_head, teacher_head):
        weight, bias = head.weight, getattr(head, "bias", None)
        assert isinstance(weight, torch.Tensor), "an nn.Linear output head"
        heads.append((weight, bias if isinstance(bias, torch.Tensor) else None))
    rows = min(heads[0][0].shape[0], heads[1][0].shape[0])
    (ws, bs), (wt, bt) = heads
    if ws.shape[0] == wt.shape[0]:
        return (ws, bs), (wt, bt)
    return (ws[:rows], None if bs is None else bs[:rows]), (wt[:rows], None if bt is None else bt[:rows])
