"""What every config model shares: strict fields, and the one-line error the CLI prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

Precision = Literal["fp32", "bf16", "fp16"]


class Strict(BaseModel):
    # coerce_numbers_to_str: `tracking.run_name=2024` arrives from YAML as an int.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


class ConfigError(ValueError):
    """A one-line, user-facing configuration error (CLI exit code 2)."""


@dataclass(frozen=True)
class Sampling:
    """How a sampler draws one response: at most `max_new_tokens` new tokens, at `temperature`
    (0: greedy) after nucleus `top_p`, ending at the model's EOS ids. Built once
    from the config (`RolloutConfig.sampling()`, `EvalConfig.sampling()`, a method's teacher's)
    and handed to every sampler (engines, TRL's rollouts, episode agents): a knob has one route."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling: want max_new_tokens >= 1, temperature >= 0, 0 < top_p <= 1 ({self})")
