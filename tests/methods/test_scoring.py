"""The shared on-policy scoring core: strict lengths, OPD advantages, unpadding (all on tensors)."""

from __future__ import annotations

import pytest
import torch

from distill.config import OPDMethod
from distill.engines.base import TokenScores, right_pad
from distill.methods.scoring import KLMeter, check_lengths, token_advantages, unpad_rows


def scores(rows: list[list[float]], width: int | None = None) -> TokenScores:
    """Right-padded [B, T] scores from per-row lists (as an engine hands them back)."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    values = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        values[i, : len(row)] = torch.tensor(row)
    _, mask = right_pad([[0] * len(r) for r in rows], 0, width)
    return TokenScores(values, mask.bool())


def mask_of(tokens: list[list[int]], width: int | None = None) -> torch.Tensor:
    return right_pad(tokens, 0, width)[1]


# ---------------------------------------------------------------- check_lengths


def test_check_lengths_accepts_equal_rows() -> None:
    check_lengths(
        mask_of([[1, 2, 3], [4], []]),
        scores([[-0.1, -0.2, -0.3], [-1.0], []]),
        scores([[-0.5, -0.5, -0.5], [-2.0], []]),
    )


@pytest.mark.parametrize(
    ("tokens", "student", "teacher", "index"),
    [
        ([[1, 2, 3]], [[-0.1, -0.2]], [[-0.1, -0.2, -0.3]], 0),  # student logprobs short
        ([[1, 2, 3]], [[-0.1, -0.2, -0.3]], [[-0.1, -0.2]], 0),  # teacher logprobs short
        ([[1, 2]], [[-0.1, -0.2, -0.3]], [[-0.1, -0.2, -0.3]], 0),  # tokens short
        ([[1], [1, 2]], [[-0.1], [-0.1, -0.2]], [[-0.1], [-0.1, -0.2, -0.3]], 1),  # teacher long, sample 1
        ([[1], [1], [1, 2]], [[-1.0], [-1.0], [-1.0]], [[-1.0], [-1.0], [-1.0, -1.0]], 2),
    ],
)
def test_check_lengths_per_sample_mismatch(
    tokens: list[list[int]], student: list[list[float]], teacher: list[list[float]], index: int
) -> None:
    with pytest.raises(ValueError, match="length mismatch") as info:
        check_lengths(mask_of(tokens, 3), scores(student, 3), scores(teacher, 3))
    assert f"sample {index}" in str(info.value)


@pytest.mark.parametrize(
    ("n_tok", "n_s", "n_t"),
    [(2, 1, 1), (1, 2, 1), (1, 1, 2), (0, 1, 1)],
)
def test_check_lengths_sample_count_mismatch(n_tok: int, n_s: int, n_t: int) -> None:
    with pytest.raises(ValueError, match="length mismatch") as info:
        check_lengths(mask_of([[1]] * n_tok, 1), scores([[-1.0]] * n_s), scores([[-1.0]] * n_t))
    assert f"{n_tok} samples" in str(info.value)


def test_token_scores_check_names_the_row() -> None:
    with pytest.raises(ValueError, match="sample 1: 2 tokens but 1 served logprobs"):
        scores([[-1.0], [-1.0]]).check([[5], [6, 7]], "served")
    assert scores([[-1.0], [-1.0, -2.0]]).rows() == [[-1.0], [-1.0, -2.0]]


# ---------------------------------------------------------------- token_advantages


def opd_advantages(
    teacher: TokenScores, student: TokenScores, coef: float, clip: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """token_reward_direct's advantages and the step's `kl/` figures, as the loss computes them."""
    method = OPDMethod(coef=coef, advantage_clip=clip)
    adv, figures = token_advantages(method, teacher.logprobs_B_T, student.logprobs_B_T, student.mask_B_T)
    return adv, KLMeter().record(0, figures)


def test_teacher_equals_student_gives_zero() -> None:
    lp = scores([[-0.5, -1.5, -0.1], [-2.0]], 4)
    adv, stats = opd_advantages(lp, lp, coef=5.0)
    assert adv.shape == (2, 4)
    assert adv.dtype == torch.float32
    assert torch.count_nonzero(adv) == 0
    assert stats["kl/reverse_kl_mean"] == 0.0
    assert stats["kl/reverse_kl_std"] == 0.0
    assert stats["kl/advantage_mean"] == 0.0


def test_sign_and_coef() -> None:
    adv, stats = opd_advantages(scores([[-0.5, -2.0]], 3), scores([[-1.0, -1.0]], 3), coef=2.0)
    # Teacher more confident than the student -> positive; less -> negative; scaled by coef.
    assert adv[0].tolist() == pytest.approx([2.0 * 0.5, 2.0 * -1.0, 0.0])
    kl = [-1.0 - -0.5, -1.0 - -2.0]  # logp_S - logp_T
    assert stats["kl/reverse_kl_mean"] == pytest.approx(sum(kl) / 2)
    assert stats["kl/reverse_kl_std"] == pytest.approx(torch.tensor(kl).std().item())
    assert stats["kl/advantage_mean"] == pytest.approx((1.0 - 2.0) / 2)


def test_coef_scales_linearly_and_is_not_normalised() -> None:
    teacher, student = scores([[-0.1, -0.3, -3.0]]), scores([[-0.2, -0.1, -1.0]])
    a1, _ = opd_advantages(teacher, student, coef=1.0)
    a5, _ = opd_advantages(teacher, student, coef=5.0)
    assert torch.allclose(a5, 5 * a1)
    assert a1[0].tolist() == pytest.approx([0.1, -0.2, -2.0])  # raw gaps: no mean/std normalisation


def test_clip_clamps_symmetrically() -> None:
    teacher, student = scores([[0.0, -10.0, -1.0]], 4), scores([[-10.0, 0.0, -1.2]], 4)
    adv, stats = opd_advantages(teacher, student, coef=1.0, clip=2.0)
    assert adv[0].tolist() == pytest.approx([2.0, -2.0, 0.2, 0.0])
    # The KL metric reports the raw gap, not the clipped advantage.
    assert stats["kl/reverse_kl_mean"] == pytest.approx((-10.0 + 10.0 - 0.2) / 3)
    assert stats["kl/advantage_mean"] == pytest.approx(0.2 / 3)


def test_clip_applies_after_coef() -> None:
    adv, _ = opd_advantages(scores([[-1.0]]), scores([[-1.5]]), coef=10.0, clip=3.0)
    assert adv[0, 0].item() == pytest.approx(3.0)  # 10 * 0.5 = 5, clipped to 3


def test_padding_beyond_each_row_stays_zero() -> None:
    teacher = scores([[-0.1, -0.2, -0.3], [-0.5], []], 5)
    student = scores([[-1.0, -1.0, -1.0], [-2.0], []], 5)
    adv, stats = opd_advantages(teacher, student, coef=1.0, clip=0.5)
    assert adv[0, :3].tolist() == pytest.approx([0.5, 0.5, 0.5])
    assert adv[1, 0].item() == pytest.approx(0.5)
    assert torch.count_nonzero(adv[0, 3:]) == 0
    assert torch.count_nonzero(adv[1, 1:]) == 0
    assert torch.count_nonzero(adv[2]) == 0
    # Means are over real tokens only (4), not over the padded shape (15).
    assert stats["kl/advantage_mean"] == pytest.approx(4 * 0.5 / 4)
    assert stats["kl/reverse_kl_mean"] == pytest.approx((-0.9 - 0.8 - 0.7 - 1.5) / 4)


def test_all_empty_rows() -> None:
    adv, stats = opd_advantages(scores([[], []], 3), scores([[], []], 3), coef=1.0)
    assert torch.count_nonzero(adv) == 0
    assert stats == {}  # no supervised token: no figure (not a mean of 0 over none)


# ---------------------------------------------------------------- unpad_rows


def test_unpad_left_padding() -> None:
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 0, 0, 11]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    assert unpad_rows(ids, mask) == [[5, 6], [7, 8, 9, 10], [11]]


def test_unpad_right_padding() -> None:
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0], [0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert unpad_rows(ids, mask) == [[5, 6], [7], []]


def test_unpad_keeps_real_pad_valued_tokens() -> None:
    # The mask decides, not the token value: a real token equal to the pad id survives.
    ids = torch.tensor([[0, 3, 0, 4]])
    mask = torch.tensor([[0, 1, 1, 1]])
    assert unpad_rows(ids, mask) == [[3, 0, 4]]


def test_unpad_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="unpad_rows"):
        unpad_rows(torch.zeros((2, 3), dtype=torch.long), torch.ones((2, 4), dtype=torch.long))
