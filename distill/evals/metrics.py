"""Sample-level eval metrics shared by every domain and benchmark."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(
    correct: Sequence[Sequence[bool]],
    lengths: Sequence[Sequence[int]],
    truncated: Sequence[Sequence[bool]],
    k: int,
) -> dict[str, float]:
    """Per-item lists of k samples -> the `eval/<benchmark>/` metric vocabulary."""
    if not correct:
        raise ValueError("summarize: no items")
    n_items = len(correct)
    counts = [sum(row) for row in correct]
    flat_len = [x for row in lengths for x in row]
    flat_trunc = [x for row in truncated for x in row]
    avg = sum(c / len(row) for c, row in zip(counts, correct, strict=True)) / n_items
    metrics = {
        "accuracy": avg,
        f"avg@{k}": avg,
        f"pass@{k}": sum(pass_at_k(len(row), c, k) for c, row in zip(counts, correct, strict=True)) / n_items,
        "pass@1": sum(pass_at_k(len(row), c, 1) for c, row in zip(counts, correct, strict=True)) / n_items,
        "solved": float(sum(1 for c in counts if c > 0)),
        "items": float(n_items),
        "truncation_rate": sum(flat_trunc) / max(len(flat_trunc), 1),
        "response_tokens_mean": sum(flat_len) / max(len(flat_len), 1),
        "response_tokens_p90": percentile(flat_len, 0.9),
    }
    return metrics
