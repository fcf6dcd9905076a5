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

    from distill.config import Sampling


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


@dataclass(frozen=True)
class TokenScores:
    """Per-token log-probabilities of a batch of completions, right-padded [B, T]: the layout the
    trainers hold completions in. Row i has `len(completion_i)` values, then zeros; `mask_B_T`
    marks the real ones. They stay tensors on the engine's device from engine to loss."""

    logprobs_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    # With `score(..., top_k=k)`: the model's own top-k ids and logprobs at each position [B, T, k].
    topk_ids_B_T_K: torch.Tensor | None = None
    topk_logprobs_B_T_K: torch.Tensor | None = None
    # With `HFEngine.score(..., states=True)`: the final hidden states at each completion
    # position [B, T, H] (a full-vocabulary loss applies the head to them per chunk).
    states_B_T_H: torch.Tensor | None = None

    def lengths(self) -> list[int]:
        return [int(n) for n in self.mask_B_T.sum(dim=1).tolist()]

    def rows(self) -> list[list[float]]:
        """Per-row Python lists, for display and tests (the data path stays tensors)."""
        return [row[mask].tolist() for row, mask in zip(self.logprobs_B_T, self.mask_B_T.bool(), strict=True)]

    def to(self, device: torch.device | str) -> TokenScores:
        return self._map(lambda t: t.to(device))

    def widened(self, width: int) -> TokenScores:
        """The same scores right-padded to `width` positions (a trainer's batch may be wider)."""
        import torch

        have = self.logprobs_B_T.shape[1]
        if have > width:
            raise ValueError(f"scores cover {have} completion positions but the batch has {width}")

        return self._map(lambda t: torch.nn.functional.pad(t, [0, 0] * (t.dim() - 2) + [0, width - have]))

    def placed(self, offsets: Sequence[int], width: int) -> TokenScores:
        """Row i's scores moved right by `offsets[i]` positions in a [B, width] layout (zeros and
        mask 0 before them): scores of a suffix put back where the suffix sits in a longer row."""

        def move(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((t.shape[0], width, *t.shape[2:]))
            for i, (n, offset) in enumerate(zip(self.lengths(), offsets, strict=True)):
                if offset + n > width:
                    raise ValueError(f"row {i}: {n} scores at offset {offset} do not fit {width} positions")
                out[i, offset : offset + n] = t[i, :n]
            return out

        return self._map(move)

    def gathered(self, index: Sequence[Sequence[int]], width: int) -> TokenScores:
        """Row i's scores at positions `index[i]`, in order, in a [B, width] layout (zeros and mask
        0 after them): the scores of a longer row read back where a shorter one's tokens sit."""
        import torch

        def pick(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((t.shape[0], width, *t.shape[2:]))
            for i, at in enumerate(index):
                if len(at) > width:
                    raise ValueError(f"row {i}: {len(at)} positions do not fit {width}")
                out[i, : len(at)] = t[i, torch.as_tensor(list(at), dtype=torch.long, device=t.device)]
            return out

        return self._map(pick)

    def topk(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, logprobs) [B, T, k] of a `score(..., top_k=k)` call."""
        if self.topk_ids_B_T_K is None or self.topk_logprobs_B_T_K is None:
            raise ValueError("these scores were computed without top_k")
        return self.topk_ids_B_T_K, self.topk_logprobs_B_T_K

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TokenScores:
        ids, logps, states = self.topk_ids_B_T_K, self.topk_logprobs_B_T_K, self.states_B_T_H
        return TokenScores(
            fn(self.logprobs_B_T),
            fn(self.mask_B_T),
            None if ids is None else fn(ids),
            None if logps is None else fn(logps),
            None if states is None else fn(states),
        )

    def check(self, completion_ids: Sequence[Sequence[int]], who: str) -> None:
        """Exactly one logprob per completion token in every row: a mismatch is an error, never a cut."""
        lengths = self.lengths()
        if len(lengths) != len(completion_ids):
            raise ValueError(
                f"length mismatch: {len(completion_ids)} samples but {len(lengths)} {who} logprob rows"
            )
        for i, (n, row) in enumerate(zip(lengths, completion_ids, strict=True)):
            if n != len(row):
                raise ValueError(f"length mismatch in sample {i}: {len(row)} tokens but {n} {who} logprobs")


def right_pad(
    rows: Sequence[Sequence[int]], pad_id: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows as right-padded [B, T] ids and mask (T = the longest row, or `width`)."""
    import torch

    width = max((len(r) for r in rows), default=0) if width is None else width
    ids_B_T = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {i} has {len(row)} tokens, more than the width {width}")
        if row:
            ids_B_T[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
            mask_B_T[i, : len(row)] = 1
    return ids_B_T, mask_B_T


class Engine(Protocol):
    """A model behind one interface: rollouts, teacher scoring, continuation, its EOS ids."""

    tokenizer: PreTrainedTokenizerBase
    enable_thinking: bool | None
    # continue_generate reuses a per-sequence KV cache (multi-turn play prefills only new tokens).
    supports_cache: bool

    @property
    def context(self) -> int | None:
        """The positions the model takes (prompt + response); None when it does not say."""
        ...

    @property
    def eos_ids(self) -> set[int]: ...

    def render(self, prompt: str, system: str | None = None) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def prompt_ids(self, prompt: str, system: str | None = None) -> list[int]: ...

    def completion(self, row: list[int], eos: set[int]) -> Completion: ...

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
        suppress_tokens: Sequence[int] = (),
    ) -> list[Completion]:
        """One completion per prompt row, drawn as `sampling` says (greedy at temperature 0)."""
        ...

    def continue_generate(
        self, ids: Sequence[int], cache: KVCache | None, sampling: Sampling
    ) -> tuple[Completion, KVCache]: ...

    def continue_many(
        self, rows: Sequence[Sequence[int]], caches: Sequence[KVCache | None], sampling: Sampling
    ) -> list[tuple[Completion, KVCache]]:
        """`continue_generate` for many sequences at once (concurrent episodes' turns)."""
        ...

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int | None = None,
        top_k: int = 0,
        states: bool = False,
    ) -> TokenScores:
        """Log-probability of every completion token given its prompt and the tokens before it;
        with `top_k`, also the model's top-k at each position, from the same pass; with `states`,
        its final hidden states there (an engine with the weights in this process only)."""
        ...

    def score_topk(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's top-k ids and logprobs at every completion position, [B, T, k], right-padded
        (id 0, logprob 0 past a row's end)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about this engine's model."""
        ...
