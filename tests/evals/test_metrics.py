"""avg@k / pass@k / solved and the length/truncation figures."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from distill.evals.metrics import pass_at_k, percentile, summarize


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """P(at least one correct among k samples drawn without replacement from n, c correct)."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(1 for subset in subsets if any(samples[i] for i in subset))
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", [1, 2, 4, 5, 6, 8])
def test_pass_at_k_matches_brute_force(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (
                n,
                c,
                k,
            )


@pytest.mark.parametrize("k", [1, 8, 16])
def test_pass_at_k_closed_form_n16(k: int) -> None:
    n = 16
    for c in range(n + 1):
        expected = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12), (c, k)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (16, 1, 8, 0.5),  # one correct sample is in half of the 8-subsets
        (16, 1, 1, 1 / 16),
        (16, 0, 16, 0.0),
        (16, 1, 16, 1.0),
        (16, 16, 1, 1.0),
        (16, 8, 1, 0.5),
        (16, 2, 8, 1 - 3003 / 12870),  # 1 - C(14,8)/C(16,8)
        (4, 1, 2, 0.5),
        (4, 2, 2, 5 / 6),
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_exact_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct() -> None:
    for n in (1, 3, 16):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_monotone_in_k_and_c() -> None:
    n = 12
    for c in range(n + 1):
        values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    for k in range(1, n + 1):
        values = [pass_at_k(n, c, k) for c in range(n + 1)]
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(4, -1, 1), (4, 5, 1), (4, 2, 0), (4, 2, 5), (4, 2, -1), (0, 0, 1), (0, 0, 0)],
)
def test_pass_at_k_invalid_args(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_percentile_matches_numpy_linear() -> None:
    rng = np.random.default_rng(0)
    for size in (1, 2, 5, 10, 37):
        values = rng.integers(0, 100, size).tolist()
        for q in (0.0, 0.1, 0.5, 0.9, 1.0):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))
    assert percentile([], 0.9) == 0.0


def test_summarize_hand_built() -> None:
    t, f = True, False
    correct = [[t, f, f, f], [f, f, f, f], [t, t, t, t]]
    lengths = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    truncated = [[f, f, f, t], [t, t, f, f], [f, f, f, f]]
    m = summarize(correct, lengths, truncated, k=4)

    avg = (1 / 4 + 0 + 1) / 3
    assert m["avg@4"] == pytest.approx(avg)
    assert m["accuracy"] == pytest.approx(avg)
    assert m["pass@1"] == pytest.approx(avg)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["solved"] == 2.0
    assert m["items"] == 3.0
    assert m["truncation_rate"] == pytest.approx(3 / 12)
    assert m["response_tokens_mean"] == pytest.approx(6.5)
    # 12 values 1..12, linear interpolation at (12-1)*0.9 = 9.9 -> 10 + 0.9 * (11 - 10)
    assert m["response_tokens_p90"] == pytest.approx(10.9)
    assert set(m) == {
        "accuracy",
        "avg@4",
        "pass@4",
        "pass@1",
        "solved",
        "items",
        "truncation_rate",
        "response_tokens_mean",
        "response_tokens_p90",
    }


def test_summarize_k_smaller_than_samples() -> None:
    # pass@k uses the unbiased estimator with n = samples per item.
    m = summarize([[True, False, False, False]], [[3, 3, 3, 3]], [[False] * 4], k=2)
    assert m["pass@2"] == pytest.approx(1 - 3 / 6)
    assert m["avg@2"] == pytest.approx(0.25)


def test_summarize_greedy_k1() -> None:
    m = summarize(
        [[True], [False], [True], [True]], [[4], [8], [2], [2]], [[False], [True], [False], [False]], k=1
    )
    assert m["pass@1"] == m["avg@1"] == m["accuracy"] == pytest.approx(0.75)
    assert m["solved"] == 3.0
    assert m["truncation_rate"] == pytest.approx(0.25)
    assert m["response_tokens_mean"] == pytest.approx(4.0)


def test_summarize_no_items() -> None:
    with pytest.raises(ValueError, match="no items"):
        summarize([], [], [], k=1)


def test_summarize_k_larger_than_samples_raises() -> None:
    with pytest.raises(ValueError):
        summarize([[True, False]], [[1, 1]], [[False, False]], k=3)
