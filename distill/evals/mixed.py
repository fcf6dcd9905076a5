"""The eval of a run over several domains: each domain on its own items (its own verifier, its
own `eval/<domain>/` figures, its own teacher), and one result over all of them."""

from __future__ import annotations

from distill.evals.single_turn import EvalResult

# Counts add up over the parts (a part without one counts 0); every other figure that every part
# has is an item-weighted mean.
SUMMED = ("items", "solved", "overlong_skipped")


def combined(results: dict[str, EvalResult]) -> EvalResult:
    """One result over every part's items: counts summed, the rest item-weighted means (the
    accuracy of the mix is the share of all its items solved, not a mean of the parts')."""
    total = sum(r.metrics.get("items", 0.0) for r in results.values()) or 1.0
    keys = list(dict.fromkeys(k for r in results.values() for k in r.metrics))
    metrics = {}
    for k in keys:
        if k in SUMMED:
            metrics[k] = sum(r.metrics.get(k, 0.0) for r in results.values())
        elif all(k in r.metrics for r in results.values()):
            metrics[k] = sum(r.metrics[k] * r.metrics.get("items", 0.0) for r in results.values()) / total
    rows = [{**row, "domain": part} for part, r in results.items() for row in r.rows]
    return EvalResult(metrics=metrics, rows=rows)
