"""Domains: each folder exposes one builder `build(config) -> Domain`. Resolved lazily by name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distill.config import DomainConfig
    from distill.domains.base import Domain

# name -> "module:attr"; the name is the folder, the CLI word and the MLflow tag.
REGISTRY: dict[str, str] = {
    "rlve": "distill.domains.rlve:build",
    "dapo": "distill.domains.dapo:build",
    "sciworld": "distill.domains.sciworld:build",
}


def build_domain(config: DomainConfig) -> Domain:
    try:
        target = REGISTRY[config.name]
    except KeyError:
        raise ValueError(f"unknown domain {config.name!r}; known: {', '.join(REGISTRY)}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)(config)
