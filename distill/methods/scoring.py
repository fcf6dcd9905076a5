"""The scoring core every on-policy method shares: unpadding, strict length checks, advantages."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def unpad_rows(ids_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> list[list[int]]:
    """The tokens of each row where the mask is 1, in order (works for left and right padding)."""
    if ids_B_T.shape != mask_B_T.shape:
        raise ValueError(f"unpad_rows: ids {tuple(ids_B_T.shape)} vs mask {tuple(mask_B_T.shape)}")
    return [row[m.bool()].tolist() for row, m in zip(ids_B_T, mask_B_T, strict=True)]


def check_lengths(
    tokens: Sequence[Sequence[int]],
    student_logprobs: Sequence[Sequence[float]],
    teacher_logprobs: Sequence[Sequence[float]],
) -> None:
    """Student tokens, student logprobs and teacher logprobs must match per sample: never truncate."""
    if not len(tokens) == len(student_logprobs) == len(teacher_logprobs):
        raise ValueError(
            f"length mismatch: {len(tokens)} samples, {len(student_logprobs)} student logprob rows, "
            f"{len(teacher_logprobs)} teacher logprob rows"
        )
    for i, (tok, s, t) in enumerate(zip(tokens, student_logprobs, teacher_logprobs, strict=True)):
        if not len(tok) == len(s) == len(t):
            raise ValueError(
                f"length mismatch in sample {i}: {len(tok)} student tokens, {len(s)} student logprobs, "
                f"{len(t)} teacher logprobs"
            )


def opd_advantages(
    teacher_logprobs: Sequence[Sequence[float]],
    student_logprobs: Sequence[Sequence[float]],
    shape: torch.Size | tuple[int, int],
    coef: float,
    clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A_t = coef * (logp_T - logp_S), right-padded to `shape`, plus the `kl/` step metrics.

    The sampled-token reverse-KL estimate per token is logp_S - logp_T.
    """
    adv_B_T = torch.zeros(shape, dtype=torch.float32)
    kl_tokens: list[float] = []
    for i, (t_row, s_row) in enumerate(zip(teacher_logprobs, student_logprobs, strict=True)):
        if len(t_row) != len(s_row):
            raise ValueError(
                f"length mismatch in sample {i}: {len(s_row)} student vs {len(t_row)} teacher logprobs"
            )
        if not t_row:
            continue
        gap = torch.tensor(t_row, dtype=torch.float32) - torch.tensor(s_row, dtype=torch.float32)
        kl_tokens.extend((-gap).tolist())
        adv_B_T[i, : len(t_row)] = coef * gap
    if clip is not None:
        adv_B_T = adv_B_T.clamp(-clip, clip)
    kl = torch.tensor(kl_tokens) if kl_tokens else torch.zeros(1)
    n_tokens = max(1, len(kl_tokens))
    stats = {
        "kl/reverse_kl_mean": float(kl.mean()),
        "kl/reverse_kl_std": float(kl.std()) if kl.numel() > 1 else 0.0,
        "kl/advantage_mean": float(adv_B_T.sum() / n_tokens),
    }
    return adv_B_T, stats
