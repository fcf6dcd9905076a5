"""Methods: one file each, resolved lazily by name (the file name = CLI word = MLflow tag)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distill.methods.context import RunContext

REGISTRY: dict[str, str] = {
    "sft": "distill.methods.sft:train",
    "opd": "distill.methods.opd:train",
    "opsd": "distill.methods.opsd:train",
    "rose": "distill.methods.rose:train",
}


# Multi-turn domains train on whole episodes: they have their own versions of the methods they
# support, and no others (key: domain name).
DOMAIN_REGISTRY: dict[str, dict[str, str]] = {
    "sciworld": {
        "sft": "distill.methods.episodes:train_sft",
        "rose": "distill.methods.episodes_online:train_rose",
        "opd": "distill.methods.episodes_online:train_opd",
    },
}


def get_method(name: str, domain: str | None = None) -> Callable[[RunContext], None]:
    """The training function of method `name` (on `domain`, when it has its own versions)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(REGISTRY)}")
    target = REGISTRY[name]
    if domain in DOMAIN_REGISTRY:
        own = DOMAIN_REGISTRY[domain]
        if name not in own:
            raise ValueError(
                f"method {name!r} does not run on the multi-turn domain {domain!r}; "
                f"methods for {domain}: {', '.join(own)}"
            )
        target = own[name]
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
