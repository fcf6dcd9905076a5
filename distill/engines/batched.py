"""Continue many token sequences at once, each from its own KV cache (multi-turn episodes).

Concurrent episodes each hold the KV cache of their last turn (`HFEngine.continue_generate`);
decoding them one at a time leaves the model working on a single row. Here their caches are
stacked into one batch, left-padded to the longest, every episode's new tokens (its latest
observation) are prefilled in one forward, and all rows decode together:

    row i:  [pad .. | cache_i (c_i) | pad .. | new_i (s_i) | generated ..]

Padding sits inside the row and is masked; position ids are given per row (c_i, c_i + 1, ...)
so every token keeps the position it has in its own sequence, and each row's cache comes back
as its own contiguous DynamicCache, as `continue_generate` would have left it. A row stops at
its EOS or its budget; its last token is never fed back (the cache ends one token short). After the
prefill, the decode steps of llama-family models skip the transformers call (engines/decode.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from distill.config import Sampling
from distill.engines.base import Completion, KVCache
from distill.engines.decode import DecodeState, lean_decoder

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class Decoding(Protocol):
    """What `continue_many` needs of an engine (the hf engine's model in this process)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    lean_decode: bool

    @property
    def eos_ids(self) -> set[int]: ...

    def completion(self, row: list[int], eos: set[int]) -> Completion: ...


def _layers(past: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """(keys, values) per layer of a plain DynamicCache; None for any other cache kind."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers: list[Any] = list(past.layers) if type(past) is DynamicCache else []
    if not layers or any(type(layer) is not DynamicLayer or layer.keys is None for layer in layers):
        return None  # sliding-window, linear-attention or offloaded layers: not stacked here
    return [(layer.keys, layer.values) for layer in layers]


def sample(logits_B_V: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Greedy at temperature 0; else temperature then nucleus (top-p) sampling, as `generate` does."""
    if temperature <= 0:
        return logits_B_V.argmax(-1)
    probs_B_V = torch.softmax(logits_B_V.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_B_V, order_B_V = probs_B_V.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the top token always stays).
        drop_B_V = sorted_B_V.cumsum(-1) - sorted_B_V > top_p
        sorted_B_V = sorted_B_V.masked_fill(drop_B_V, 0.0)
        probs_B_V = torch.zeros_like(probs_B_V).scatter(-1, order_B_V, sorted_B_V)
    return torch.multinomial(probs_B_V, 1)[:, 0]


def _stack(caches: list[list[tuple[torch.Tensor, torch.Tensor]] | None], lengths: list[int]) -> Any:
    """One DynamicCache for the batch: each row's cache left-padded to the longest."""
    from transformers import DynamicCache

    width = max(lengths)
    if width == 0:
        return None
    template = next(c for c in caches if c is not None)
    stacked = []
    for layer, (k0, _) in enumerate(template):
        heads, dim = k0.shape[1], k0.shape[3]
        keys, values = [], []
        for cache, n in zip(caches, lengths, strict=True):
            pad = k0.new_zeros((1, heads, width - n, dim))
            k, v = cache[layer] if cache is not None else (k0[:, :, :0], k0[:, :, :0])
            keys.append(torch.cat([pad, k], dim=2))
            values.append(torch.cat([pad, v], dim=2))
        stacked.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(ddp_cache_data=stacked)


def _split(
    layers: list[tuple[torch.Tensor, torch.Tensor]], mask_B_L: torch.Tensor
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each row's unmasked cache positions, in order: its own contiguous cache."""
    rows = []
    for i in range(mask_B_L.shape[0]):
        keep = mask_B_L[i].bool()
        rows.append([(k[i : i + 1, :, keep], v[i : i + 1, :, keep]) for k, v in layers])
    return rows


class _Turn:
    """The batch's first forward: each row's new tokens after its reusable cache, left-padded."""

    def __init__(self, rows: Sequence[Sequence[int]], kept: list[int], pad: int) -> None:
        new = [list(ids[n:]) for ids, n in zip(rows, kept, strict=True)]
        width_C, width_S = max(kept), max(len(s) for s in new)
        batch = len(rows)
        self.ids_B_S = torch.full((batch, width_S), pad, dtype=torch.long)
        self.mask_B_L = torch.zeros((batch, width_C + width_S), dtype=torch.long)
        self.pos_B_S = torch.zeros((batch, width_S), dtype=torch.long)
        for i, (n, s) in enumerate(zip(kept, new, strict=True)):
            self.ids_B_S[i, width_S - len(s) :] = torch.tensor(s, dtype=torch.long)
            self.mask_B_L[i, width_C - n : width_C] = 1
            self.mask_B_L[i, width_C + width_S - len(s) :] = 1
            self.pos_B_S[i] = torch.arange(n + len(s) - width_S, n + len(s)).clamp(min=n)
        # The position of each row's first generated token.
        self.next_pos = [n + len(s) for n, s in zip(kept, new, strict=True)]


def _reusable(
    rows: Sequence[Sequence[int]], caches: Sequence[KVCache | None]
) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]] | None], list[int]] | None:
    """Per row: the cache layers of the ids it shares with the row's start (or None) and how
    many those are; None when a cache is of a kind `_stack` cannot take. A cache may run past
    the shared part (a turn cut short after it was written, `play.end_turn`): its layers are
    cut to the shared ids, and the row prefills at least its last token."""
    reused: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = []
    kept: list[int] = []
    for ids, cache in zip(rows, caches, strict=True):
        prefix = cache.ids if cache is not None and cache.past is not None else []
        shared = _shared(prefix, ids)
        if shared > 0:
            assert cache is not None
            layers = _layers(cache.past)
            if layers is None:
                return None
            reused.append(
                layers if shared == len(prefix) else [(k[:, :, :shared], v[:, :, :shared]) for k, v in layers]
            )
            kept.append(shared)
        else:
            reused.append(None)
            kept.append(0)
    return reused, kept


def _shared(prefix: Sequence[int], ids: Sequence[int]) -> int:
    """How many leading ids `prefix` and `ids` share, at most all but the last of `ids`."""
    n = 0
    for a, b in zip(prefix, ids[:-1], strict=False):
        if a != b:
            break
        n += 1
    return n


def continue_many(
    engine: Decoding,
    rows: Sequence[Sequence[int]],
    caches: Sequence[KVCache | None],
    budgets: Sequence[int],
    sampling: Sampling,
) -> list[tuple[Completion, KVCache]] | None:
    """One completion per row (at most `budgets[i]` >= 1 new tokens), reusing each row's cache
    where it holds a prefix of the row; None when a cache is of a kind this cannot stack (the
    caller continues the rows one at a time)."""
    from transformers import DynamicCache

    found = _reusable(rows, caches)
    if found is None:
        return None
    reused, kept = found
    model, device = engine.model, engine.model.device
    pad, eos = int(engine.tokenizer.pad_token_id), engine.eos_ids
    turn = _Turn(rows, kept, pad)
    past, mask_B_L = _stack(reused, kept), turn.mask_B_L
    generated: list[list[int]] = [[] for _ in rows]
    active = [True] * len(rows)
    with torch.inference_mode():
        out = model(
            input_ids=turn.ids_B_S.to(device),
            attention_mask=mask_B_L.to(device),
            position_ids=turn.pos_B_S.to(device),
            cache=past if past is not None else DynamicCache(),
            use_cache=True,
            logits_to_keep=1,
        )
        past, logits_B_V = out.cache, out.logits[:, -1]
        # The decode steps: lean where the model's family allows (engines/decode.py).
        lean = None
        if engine.lean_decode and lean_decoder(model) is not None:
            lean = DecodeState(model, past, mask_B_L.to(device), max(budgets))
        while True:
            tokens = sample(logits_B_V, sampling.temperature, sampling.top_p).tolist()
            feed = []
            for i, tok in enumerate(tokens):
                if active[i]:
                    generated[i].append(tok)
                    active[i] = tok not in eos and len(generated[i]) < budgets[i]
                feed.append(active[i])
            if not any(feed):
                break
            # Rows still writing feed their last token; finished rows feed a masked pad.
            inputs_B = torch.tensor([g[-1] if on else pad for g, on in zip(generated, feed, strict=True)])
            positions_B = torch.tensor(
                [p + len(g) - 1 for p, g in zip(turn.next_pos, generated, strict=True)]
            )
            if lean is not None:
                logits_B_V = lean.step(
                    inputs_B.to(device), positions_B.to(device), torch.tensor(feed, device=device)
                )
                continue
            mask_B_L = torch.cat([mask_B_L, torch.tensor(feed, dtype=torch.long)[:, None]], dim=1)
            out = model(
                input_ids=inputs_B[:, None].to(device),
                attention_mask=mask_B_L.to(device),
                position_ids=positions_B[:, None].to(device),
                cache=past,
                use_cache=True,
                logits_to_keep=1,
            )
            past, logits_B_V = out.cache, out.logits[:, -1]
    if lean is not None:
        final, mask_B_L = lean.layers(), lean.mask().cpu()
    else:
        final = [(layer.keys, layer.values) for layer in past.layers]
    return [
        (engine.completion(generated[i], eos), _row_cache(list(rows[i]) + generated[i], row_layers))
        for i, row_layers in enumerate(_split(final, mask_B_L))
    ]


def _row_cache(seen: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> KVCache:
    """A row's own cache and the ids it holds (all it has seen but its last generated token)."""
    from transformers import DynamicCache

    return KVCache(DynamicCache(ddp_cache_data=layers), seen[: layers[0][0].shape[2]])
