"""Benchmark items whose prompt alone fills the model's context (`eval.overlong`).

A model with 1,024 positions cannot answer a 1,273-token AIME prompt. `fail` (the default) stops
before anything is generated, naming the items; `skip` leaves them out of the eval and says how
many and which, in the printed summary, the metrics (`overlong_skipped`) and the per-item record,
as verl's `filter_overlong_prompts` drops them from a dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill.engines.context import ContextError

if TYPE_CHECKING:
    from distill.domains.base import Item

SHOWN_ITEMS = 5


@dataclass
class Fit:
    """Items split by whether their prompt leaves the model room to answer."""

    kept: list[int] = field(default_factory=list)  # indices into the items
    overlong: list[tuple[Any, int]] = field(default_factory=list)  # (item id, prompt tokens)

    def rows(self, context: int | None) -> list[dict[str, Any]]:
        """The eval record's rows of the skipped items."""
        return [
            {"id": item_id, "skipped": "overlong", "prompt_tokens": n, "context": context}
            for item_id, n in self.overlong
        ]


def named(overlong: Sequence[tuple[Any, int]]) -> str:
    """`id (n tokens)` for the first few items, and how many more."""
    shown = ", ".join(f"{item_id} ({n} tokens)" for item_id, n in overlong[:SHOWN_ITEMS])
    more = len(overlong) - SHOWN_ITEMS
    return shown + (f" and {more} more" if more > 0 else "")


def fit_context(
    items: Sequence[Item], prompt_lengths: Sequence[int], context: int | None, policy: str, who: str
) -> Fit:
    """Split `items` by the room their prompt leaves in `context` positions; with policy `fail`
    any prompt that fills it raises ContextError naming the items and the two ways out."""
    fit = Fit()
    for i, (item, n) in enumerate(zip(items, prompt_lengths, strict=True)):
        if context is not None and n >= context:
            fit.overlong.append((item.id, n))
        else:
            fit.kept.append(i)
    if fit.overlong and policy == "fail":
        raise ContextError(
            f"{who}: {len(fit.overlong)} of {len(items)} prompts fill the model's {context} positions, leaving "
            f"no room to answer: {named(fit.overlong)}; set eval.overlong=skip to leave them out, or use a "
            "model with a longer context"
        )
    if fit.overlong and not fit.kept:
        raise ContextError(
            f"{who}: every one of the {len(items)} prompts fills the model's {context} positions "
            f"({named(fit.overlong)}); nothing is left to evaluate: use a model with a longer context"
        )
    return fit
