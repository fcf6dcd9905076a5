"""Methods: one file each (sft, opd, rose, opsd), the episode versions for episodic domains
(episode_sft, episode_online), and the core they share: scoring.py, budget.py, online.py,
callbacks.py (the loss kernels live below, in `distill/kernels/`). Resolved lazily by name
through `distill/registry.py` (the file name = the CLI word = the MLflow tag)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from distill import registry

if TYPE_CHECKING:
    from distill.methods.context import RunContext


def get_method(name: str, domain: str) -> Callable[[RunContext], None]:
    """The training function of method `name` on `domain` (its episode version on an episodic one)."""
    train: Callable[[RunContext], None] = registry.resolve(registry.method_target(name, domain))
    return train
