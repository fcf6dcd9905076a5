"""Evaluation: single-turn (k samples, graded: avg@k, pass@k, solved), episodes on an episodic
domain (Score, Success, Pass(>0)), and `distill eval` of one model outside a run (standalone.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from distill import registry
from distill.evals.single_turn import evaluate

if TYPE_CHECKING:
    from distill.config import EvalConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.evals.single_turn import EvalResult


class Evaluator(Protocol):
    def __call__(
        self,
        engine: Engine,
        domain: Domain,
        items: list[Item],
        config: EvalConfig,
        label: str = "eval",
        show_progress: bool = True,
    ) -> EvalResult: ...


def evaluator_for(domain: Domain) -> Evaluator:
    """The eval of a run on `domain`: single-turn responses, or episodes for an episodic domain."""
    if registry.domain_entry(domain.name).episodic:
        from distill.evals.agent import evaluate_episodes

        return evaluate_episodes

    return evaluate
