"""pass@k at the reference protocol's n=16: hand-computed values and Chen et al.'s product form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distill.evals.metrics import pass_at_k, summarize

N = 16
# C(16, 8) = 12870; pass@8 = 1 - C(16 - c, 8) / 12870, worked out by hand for small c.
HAND_PASS_AT_8 = {
    0: 0.0,
    1: 1 - 6435 / 12870,  # C(15,8) = 6435: exactly one half
    2: 1 - 3003 / 12870,  # C(14,8) = 3003: 23/30
    3: 1 - 1287 / 12870,  # C(13,8) = 1287: 9/10
    4: 1 - 495 / 12870,  # C(12,8) = 495
    8: 1 - 1 / 12870,  # only the all-wrong subset misses
    9: 1.0,  # fewer than 8 wrong samples: every 8-subset holds a correct one
    16: 1.0,
}


def chen_product(n: int, c: int, k: int) -> float:
    """The numerically stable form from the Codex paper: 1 - prod_{i=n-c+1}^{n} (1 - k / i)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@pytest.mark.parametrize("c", range(N + 1))
def test_pass_at_1_and_16(c: int) -> None:
    assert pass_at_k(N, c, 1) == pytest.approx(c / N, abs=1e-12)
    assert pass_at_k(N, c, 16) == (1.0 if c > 0 else 0.0)


@pytest.mark.parametrize("c", sorted(HAND_PASS_AT_8))
def test_pass_at_8_hand_computed(c: int) -> None:
    assert pass_at_k(N, c, 8) == pytest.approx(HAND_PASS_AT_8[c], abs=1e-12)


def test_hand_values_are_the_fractions_claimed() -> None:
    assert HAND_PASS_AT_8[1] == 0.5
    assert HAND_PASS_AT_8[2] == pytest.approx(23 / 30, abs=1e-15)
    assert HAND_PASS_AT_8[3] == pytest.approx(9 / 10, abs=1e-15)


@pytest.mark.parametrize("k", [1, 8, 16])
def test_matches_comb_and_product_forms(k: int) -> None:
    for c in range(N + 1):
        comb = 1.0 - math.comb(N - c, k) / math.comb(N, k)
        assert pass_at_k(N, c, k) == pytest.approx(comb, abs=1e-12), (c, k)
        assert pass_at_k(N, c, k) == pytest.approx(chen_product(N, c, k), abs=1e-12), (c, k)


def test_summarize_over_a_benchmark_of_17_problems() -> None:
    # Problem c has c correct of 16 samples, c = 0..16.
    correct = [[i < c for i in range(N)] for c in range(N + 1)]
    lengths = [[100] * N for _ in correct]
    truncated = [[False] * N for _ in correct]
    m = summarize(correct, lengths, truncated, k=N)
    assert m["avg@16"] == pytest.approx(sum(c / N for c in range(N + 1)) / 17)
    assert m["pass@1"] == pytest.approx(m["avg@16"])
    assert m["pass@16"] == pytest.approx(16 / 17)
    assert m["solved"] == 16.0 and m["items"] == 17.0
