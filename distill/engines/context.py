"""A model's context and a token budget: one policy for every method, eval and engine.

The policy, decided before any generation (config and load time) and enforced again inside the
engines so nothing runs past the context deep in attention:

- prompt + budget within the context: nothing to do;
- a budget beyond the room a prompt leaves: the response is **capped** at the room (context minus
  the prompt: each prompt its own on the hf engine, `hf.budget_groups`; the longest prompt's for a
  served model's whole request), with one warning line naming the setting and how many of the
  prompts it caps; a capped response is a truncation like any other (ended without EOS);
- a prompt that alone fills the context: a one-line **error** naming the setting and the model's
  context, before anything runs.

The embedded zoo models have 1,024 positions (4,096 on sciworld); the reference eval protocol asks
for 31,744 new tokens, which is capped, not run for half an hour past the model's positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ContextError(ValueError):
    """A prompt leaves no room in the model's context (a one-line, user-facing error)."""


def context_length(model: Any) -> int | None:
    """The positions a transformers model was built for (`max_position_embeddings`), if it says."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def room(context: int | None, prompt_len: int, max_new_tokens: int) -> int:
    """The new tokens a prompt of `prompt_len` may have: the budget, capped at the context."""
    if context is None:
        return max_new_tokens
    return min(max_new_tokens, context - prompt_len)


@dataclass(frozen=True)
class BudgetCheck:
    """What a budget does against a model's context on a set of prompts."""

    setting: str
    budget: int
    context: int | None
    prompts: int
    capped: int  # prompts whose room is below the budget
    longest_prompt: int

    def warning(self) -> str | None:
        if not self.capped or self.context is None:
            return None
        return (
            f"{self.setting}={self.budget} does not fit the model's {self.context} positions: responses are "
            f"capped at the context minus the prompt (down to {self.context - self.longest_prompt} new tokens) "
            f"for {self.capped} of {self.prompts} prompts, and count as truncated"
        )


def check_budget(
    setting: str, budget: int, context: int | None, prompt_lengths: Sequence[int], who: str
) -> BudgetCheck:
    """The budget policy on these prompts: raises ContextError when one leaves no room at all."""
    longest = max(prompt_lengths, default=0)
    if context is not None and longest >= context:
        raise ContextError(
            f"{who}: a prompt of {longest} tokens fills the model's {context} positions, leaving no room "
            f"for {setting}; use shorter prompts or a model with a longer context"
        )
    capped = sum(1 for n in prompt_lengths if room(context, n, budget) < budget)
    return BudgetCheck(setting, budget, context, len(prompt_lengths), capped, longest)
