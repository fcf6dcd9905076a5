"""The scoring core every on-policy method shares: the trainer's batch layout, strict lengths,
advantages and the step's `kl/` figures.

Everything stays a tensor on the model's device: the teacher's and the student's per-token
logprobs arrive as right-padded [B, T] `TokenScores` (the trainer's completion layout), and the
student's own logprobs in a loss come from hidden states through the chunked head
(`kernels/states.py`, `kernels/heads.py`), so no path holds a [B, T, vocab] tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from distill.config import OnPolicyKL
from distill.engines.base import Engine, TokenScores


def vocab_rows(engine: Engine) -> int:
    """The ids `engine` can score: its output head's rows when the model is in this process or
    its worker's (they may differ from the tokenizer's size: Qwen3 has 151,936 rows for 151,669
    tokens), else its tokenizer's size."""
    rows = getattr(engine, "head_rows", None)  # a teacher in its worker process (engines/worker.py)
    if isinstance(rows, int):
        return rows
    model = getattr(engine, "model", None)
    head = getattr(model, "get_output_embeddings", lambda: None)() if model is not None else None
    # The module's declared rows: a weight split over the ranks (ZeRO-3) holds none of them here.
    rows = getattr(head, "out_features", None)
    return int(rows) if isinstance(rows, int) else len(engine.tokenizer)


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


def advantages(method: OnPolicyKL, gap: torch.Tensor) -> torch.Tensor:
    """A = coef * (logp_T - logp_S), clamped to +-advantage_clip when set (never normalised)."""
    adv = method.coef * gap
    return adv if method.advantage_clip is None else adv.clamp(-method.advantage_clip, method.advantage_clip)


def token_advantages(
    method: OnPolicyKL, teacher_B_T: torch.Tensor, student_B_T: torch.Tensor, mask_B_T: torch.Tensor
) -> tuple[torch.Tensor, Figures]:
    """token_reward_direct's A_t = coef * (logp_T - logp_S) on the completion positions (0
    elsewhere), and the figures of the supervised tokens: the raw gap (not the clamped advantage)
    is the reverse-KL estimate logp_S - logp_T."""
    gap_B_T = (teacher_B_T.to(student_B_T.device) - student_B_T) * mask_B_T
    adv_B_T = advantages(method, gap_B_T) * mask_B_T
    on = mask_B_T.bool()
    return adv_B_T, Figures(-gap_B_T[on], adv_B_T[on], clipped(method, gap_B_T[on]))


def clipped(method: OnPolicyKL, gap_N: torch.Tensor) -> torch.Tensor | None:
    """1 where the advantage clamp binds (|coef * gap| above advantage_clip), per token; None
    without a clamp."""
    if method.advantage_clip is None:
        return None
    return ((method.coef * gap_N).abs() > method.advantage_clip).float()


@dataclass
class Figures:
    """What one micro-batch's loss says about the signal, per supervised token: the reverse-KL
    estimate (logp_S - logp_T), the advantage, where the clamp bound, and for a top-k loss the
    student's and the teacher's probability mass on the teacher's top-k ids and the share of the
    teacher's top-k in the student's. `kept_N`: which of the batch's completion tokens (row-major)
    the per-token figures are of (None: every one)."""

    reverse_kl_N: torch.Tensor
    advantage_N: torch.Tensor | None = None
    clipped_N: torch.Tensor | None = None
    student_topk_mass_N: torch.Tensor | None = None
    teacher_topk_mass_N: torch.Tensor | None = None
    topk_overlap: float | None = None
    kept_N: torch.Tensor | None = None

    def subset(self, select_N: torch.Tensor) -> Figures:
        """The sampled-token figures of the tokens `select_N` marks (one domain's rows)."""
        pick = None if self.advantage_N is None else self.advantage_N[select_N]
        clip = None if self.clipped_N is None else self.clipped_N[select_N]
        return Figures(self.reverse_kl_N[select_N], pick, clip)


class KLMeter:
    """The step's `kl/` figures over all its micro-batches (a step may accumulate several)."""

    def __init__(self) -> None:
        self.step = -1
        self.n = 0
        self.total = self.squares = self.advantage = 0.0
        self._means: dict[str, tuple[float, int]] = {}

    def _at(self, step: int) -> None:
        if step != self.step:
            self.step, self.n, self.total, self.squares, self.advantage = step, 0, 0.0, 0.0, 0.0
            self._means = {}

    def mean(self, step: int, name: str, values_N: torch.Tensor) -> dict[str, float]:
        """`name`: the mean of per-token `values_N` over the step's micro-batches so far."""
        self._at(step)
        total, count = self._means.get(name, (0.0, 0))
        total, count = total + float(values_N.detach().double().sum()), count + values_N.numel()
        self._means[name] = (total, count)
        return {name: total / count} if count else {}  # a mean over no tokens is no figure

    def add(
        self, step: int, reverse_kl_N: torch.Tensor, advantage_sum: torch.Tensor | None = None
    ) -> dict[str, float]:
        self._at(step)
        values = reverse_kl_N.detach().double()
        self.n += values.numel()
        self.total += float(values.sum())
        self.squares += float((values * values).sum())
        if advantage_sum is not None:
            self.advantage += float(advantage_sum)
        if not self.n:  # every sample of the step masked so far: no figure (diagnose reads none)
            return {}
        n = self.n
        mean = self.total / n
        var = (self.squares - n * mean * mean) / (n - 1) if self.n > 1 else 0.0
        stats = {"kl/reverse_kl_mean": mean, "kl/reverse_kl_std": math.sqrt(max(var, 0.0))}
        if advantage_sum is not None:
            stats["kl/advantage_mean"] = self.advantage / n
        return stats

    def record(self, step: int, figures: Figures) -> dict[str, float]:
        """The step's `kl/` metrics with this micro-batch's `figures` in."""
        advantage_sum = None if figures.advantage_N is None else figures.advantage_N.sum()
        out = self.add(step, figures.reverse_kl_N, advantage_sum)
        for name, values in (
            ("kl/clip_share", figures.clipped_N),
            ("kl/student_topk_mass", figures.student_topk_mass_N),
            ("kl/teacher_topk_mass", figures.teacher_topk_mass_N),
        ):
            if values is not None:
                out.update(self.mean(step, name, values))
        if figures.topk_overlap is not None:
            out["kl/topk_overlap"] = figures.topk_overlap
        return out
