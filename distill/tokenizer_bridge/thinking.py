"""One assistant turn, one think block: the teacher continues the student's, never opens its own.

A student prefix can end mid-reasoning inside `<think>`. The teacher then continues in the same
assistant turn: its prompt must not carry a think block of its own (Qwen3's template writes an
empty `<think></think>` for enable_thinking=false; thinking-only templates open one), and its
continuation must not open a second one, so generation suppresses the `<think>` token.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.engines.base import Engine

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# A think block (empty or only opened) that a chat template appended to the generation prompt.
_TRAILING_THINK = re.compile(r"<think>(\s*</think>)?\s*$")


def has_think(text: str) -> bool:
    return THINK_OPEN in text


def reopened(prefix_text: str, continuation_text: str) -> bool:
    """The continuation opened a think block although the student's prefix already had one."""
    return has_think(prefix_text) and has_think(continuation_text)


def teacher_prompt_ids(teacher: Engine, prompt: str, prefix_text: str) -> list[int]:
    """The teacher's chat prompt (ending with its assistant header) to continue `prefix_text`."""
    if not has_think(prefix_text):
        return teacher.prompt_ids(prompt)
    return teacher.encode(_TRAILING_THINK.sub("", teacher.render(prompt)))


def think_open_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The id of `<think>` when the vocabulary has it as one token (else nothing to suppress)."""
    token_id = tokenizer.convert_tokens_to_ids(THINK_OPEN)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        return []
    return [token_id]
