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


def get_method(name: str) -> Callable[[RunContext], None]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(REGISTRY)}") from None
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
