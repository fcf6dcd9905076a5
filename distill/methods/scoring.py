"""The scoring core every on-policy method shares: the trainer's batch layout, strict lengths,
advantages.

Everything stays a tensor on the model's device: the teacher's and the student's per-token
logprobs arrive as right-padded [B, T] `TokenScores` (the trainer's completion layout), and the
student's own logprobs in a loss come from hidden states through the chunked head
(`kernels/states.py`, `kernels/heads.py`), so no path holds a [B, T, vocab] tensor.
"""

from __future__ import annotations

import torch

from distill.engines.base import TokenScores


def unpad_rows(ids_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> list[list[int]]:
    """The tokens of each row where the mask is 1, in order (works for left and right padding)."""
    if ids_B_T.shape != mask_B_T.shape:
        raise ValueError(f"unpad_rows: ids {tuple(ids_B_T.shape)} vs mask {tuple(mask_B_T.shape)}")
    return [row[m.bool()].tolist() for row, m in zip(ids_B_T, mask_B_T, strict=True)]


def check_lengths(completion_mask_B_T: torch.Tensor, *scores: TokenScores) -> None:
    """Every scorer's logprobs match the student's tokens per sample: a mismatch is an error,
    never a truncation (the student's own come from the same ids and mask in the loss)."""
    tokens = [int(n) for n in completion_mask_B_T.sum(dim=1).tolist()]
    for who, scored in zip(("teacher", "student"), scores, strict=False):
        got = scored.lengths()
        if len(got) != len(tokens):
            raise ValueError(f"length mismatch: {len(tokens)} samples, {len(got)} {who} logprob rows")
        for i, (n, m) in enumerate(zip(tokens, got, strict=True)):
            if n != m:
                raise ValueError(f"length mismatch in sample {i}: {n} student tokens, {m} {who} logprobs")


def opd_advantages(
    teacher: TokenScores, student: TokenScores, coef: float, clip: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """A_t = coef * (logp_T - logp_S) on the completion positions (0 elsewhere), plus the `kl/`
    step metrics. The sampled-token reverse-KL estimate per token is logp_S - logp_T."""
    if teacher.mask_B_T.shape != student.mask_B_T.shape or not torch.equal(
        teacher.mask_B_T, student.mask_B_T.to(teacher.mask_B_T.device)
    ):
        raise ValueError(
            f"length mismatch: teacher logprobs {teacher.lengths()} vs student logprobs {student.lengths()}"
        )
    mask_B_T = student.mask_B_T
    gap_B_T = (teacher.logprobs_B_T.to(student.logprobs_B_T.device) - student.logprobs_B_T) * mask_B_T
    adv_B_T = coef * gap_B_T
    if clip is not None:
        adv_B_T = adv_B_T.clamp(-clip, clip)
    return adv_B_T, kl_stats(-gap_B_T[mask_B_T], adv_B_T.sum() / mask_B_T.sum().clamp_min(1))


def kl_stats(
    reverse_kl_N: torch.Tensor, advantage_mean: torch.Tensor | float | None = None
) -> dict[str, float]:
    """`kl/reverse_kl_mean`, `_std` over the sampled tokens (logp_S - logp_T), and
    `kl/advantage_mean` where the loss has advantages."""
    n = reverse_kl_N.numel()
    stats = {
        "kl/reverse_kl_mean": float(reverse_kl_N.mean()) if n else 0.0,
        "kl/reverse_kl_std": float(reverse_kl_N.std()) if n > 1 else 0.0,
    }
    if advantage_mean is not None:
        stats["kl/advantage_mean"] = float(advantage_mean)
    return stats
