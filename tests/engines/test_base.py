"""TokenScores: the [B, T] layout scores travel in, moved where a suffix sits in a longer row."""

from __future__ import annotations

import pytest
import torch

from distill.engines.base import TokenScores


def _scores() -> TokenScores:
    # Two rows of 3 and 1 completion positions, with a top-2 at each.
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    ids = torch.arange(12).reshape(2, 3, 2)
    return TokenScores(logps, mask, ids, -ids.float())


def test_placed_moves_each_row_to_its_offset_with_everything_else_masked() -> None:
    placed = _scores().placed([2, 4], width=6)
    assert placed.logprobs_B_T.tolist() == [[0, 0, -1, -2, -3, 0], [0, 0, 0, 0, -4, 0]]
    assert placed.mask_B_T.tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 0]]
    ids, logps = placed.topk()
    assert ids[0, 2:5].tolist() == [[0, 1], [2, 3], [4, 5]] and ids[1, 4].tolist() == [6, 7]
    assert torch.equal(logps[1, 4], torch.tensor([-6.0, -7.0])) and not ids[0, :2].any()
    assert placed.lengths() == [3, 1]


def test_placed_refuses_a_row_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="row 0: 3 scores at offset 4 do not fit 6 positions"):
        _scores().placed([4, 0], width=6)
