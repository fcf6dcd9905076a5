"""What every config model shares: strict fields, and the one-line error the CLI prints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Precision = Literal["fp32", "bf16", "fp16"]


class Strict(BaseModel):
    # coerce_numbers_to_str: `tracking.run_name=2024` arrives from YAML as an int.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


class ConfigError(ValueError):
    """A one-line, user-facing configuration error (CLI exit code 2)."""
