"""The `domain:` section of an rlve run."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from distill.config import DomainBase


class RLVEDomainConfig(DomainBase):
    name: Literal["rlve"] = "rlve"
    # rlve-gym environment identifiers and the difficulty parameter handed to generator().
    environments: list[str] = Field(default_factory=lambda: ["Sorting", "Multiplication"])
    parameters: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"Sorting": {"N": 3}, "Multiplication": {"digit_num": 1}}
    )
