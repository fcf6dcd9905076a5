"""The eval of a run over several domains: each domain on its own items (its own verifier, its
own `eval/<domain>/` figures, its own teacher), and one result over all of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.evals.single_turn import EvalResult

if TYPE_CHECKING:
    from distill.config import EvalConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.evals import Evaluator

# Counts add up over the parts; every other figure is a mean over items.
SUMMED = ("items", "solved")


def combined(results: dict[str, EvalResult]) -> EvalResult:
    """One result over every part's items: counts summed, the rest item-weighted means (the
    accuracy of the mix is the share of all its items solved, not a mean of the parts')."""
    total = sum(r.metrics.get("items", 0.0) for r in results.values()) or 1.0
    keys = [k for k in next(iter(results.values())).metrics if all(k in r.metrics for r in results.values())]
    metrics = {
        k: sum(r.metrics[k] for r in results.values())
        if k in SUMMED
        else sum(r.metrics[k] * r.metrics.get("items", 0.0) for r in results.values()) / total
        for k in keys
    }
    rows = [{**row, "domain": part} for part, r in results.items() for row in r.rows]
    return EvalResult(metrics=metrics, rows=rows)


def evaluate_parts(
    evaluate: Evaluator,
    engines: dict[str, Engine],
    parts: dict[str, tuple[Domain, list[Item]]],
    config: EvalConfig,
    label: str,
) -> dict[str, EvalResult]:
    """Each part's eval: its engine (a teacher per domain, or the one student) on its items."""
    return {
        part: evaluate(engines[part], domain, items, config, f"{label} [{part}]")
        for part, (domain, items) in parts.items()
    }
