"""What every engine is: the `Engine` protocol, and the prompt rendering all of them share.

An engine holds a model somewhere (in this process: `hf`; behind a vLLM server: `server`) and
its tokenizer here. Methods, evals and episodes talk to the protocol, never to a particular
engine: prompts are rendered once by `ChatPrompts`, so a prompt is the same token ids whoever
scores it, and token ids (never text) go in and out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Completion:
    ids: list[int]  # generated ids, including the EOS token when the model emitted one
    text: str  # decoded without special tokens
    truncated: bool  # ended at the token budget without EOS


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    system: str | None = None,
    enable_thinking: bool | None = None,
) -> str:
    """A one-turn chat prompt rendered with the tokenizer's template, ending with the assistant header."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    kwargs: dict[str, Any] = {}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"chat template of {tokenizer.name_or_path!r} did not render to text")
    return text


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text` as it stands: chat templates carry their own special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class ChatPrompts:
    """Prompt rendering every engine shares, so a prompt is the same token ids whoever scores it."""

    tokenizer: PreTrainedTokenizerBase
    enable_thinking: bool | None
    # Rendering a chat template costs ~1 ms; prompts repeat every step and every eval.
    _prompt_cache: dict[tuple[str, str | None], list[int]]

    def completion(self, row: list[int], eos: set[int]) -> Completion:
        """Generated ids cut after the first EOS (kept in ids, not in text)."""
        cut = next((i for i, tok in enumerate(row) if tok in eos), None)
        kept = row if cut is None else row[: cut + 1]
        text = str(self.tokenizer.decode(kept, skip_special_tokens=True))
        return Completion(ids=kept, text=text, truncated=cut is None)

    def render(self, prompt: str, system: str | None = None) -> str:
        """The chat-templated prompt text, ending with the assistant header."""
        return render_chat(self.tokenizer, prompt, system, self.enable_thinking)

    def encode(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def prompt_ids(self, prompt: str, system: str | None = None) -> list[int]:
        key = (prompt, system)
        if key not in self._prompt_cache:
            self._prompt_cache[key] = self.encode(self.render(prompt, system))
        return list(self._prompt_cache[key])


@dataclass
class KVCache:
    """A model's key/value cache and the token ids it holds."""

    past: Any
    ids: list[int]


class Engine(Protocol):
    """A model behind one interface: rollouts, teacher scoring, continuation, its EOS ids."""

    tokenizer: PreTrainedTokenizerBase
    enable_thinking: bool | None
    # continue_generate reuses a per-sequence KV cache (multi-turn play prefills only new tokens).
    supports_cache: bool

    @property
    def eos_ids(self) -> set[int]: ...

    def render(self, prompt: str, system: str | None = None) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def prompt_ids(self, prompt: str, system: str | None = None) -> list[int]: ...

    def completion(self, row: list[int], eos: set[int]) -> Completion: ...

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
        suppress_tokens: Sequence[int] = (),
    ) -> list[Completion]: ...

    def continue_generate(
        self,
        ids: Sequence[int],
        cache: KVCache | None,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ) -> tuple[Completion, KVCache]: ...

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int = 64,
    ) -> list[list[float]]: ...

    def score_topk(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about this engine's model."""
        ...
