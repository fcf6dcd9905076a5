"""The on-policy batch's cut at ids outside the vocabulary (methods/batch.py)."""

from __future__ import annotations

import torch

from distill.methods.batch import cut_out_of_vocab


def test_a_row_is_masked_from_its_first_id_outside_the_vocabulary_on() -> None:
    out = {
        "completion_ids": torch.tensor([[5, 9, 3, 2], [5, 12, 3, 2], [1, 2, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]),
    }
    outside, tokens = cut_out_of_vocab(out, limit=10)
    assert (outside, tokens) == (1, 10)
    # Row 1 keeps the token before the id 12 only; the others are untouched.
    assert out["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    # The cut row is marked, so it does not count as truncated (it never reached the budget).
    assert out["cut_B"] == [False, True, False]


def test_an_id_under_padding_is_not_an_outside_id() -> None:
    out = {"completion_ids": torch.tensor([[1, 99]]), "completion_mask": torch.tensor([[1, 0]])}
    assert cut_out_of_vocab(out, limit=10) == (0, 1)
    assert out["completion_mask"].tolist() == [[1, 0]] and out["cut_B"] == [False]
