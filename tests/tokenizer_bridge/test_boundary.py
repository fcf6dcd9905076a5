"""What a token boundary means on each side: the prefix index of a vocabulary and the teacher's
byte-prefix correction (tokenizer_bridge/boundary.py), on the zoo's real tokenizers."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from distill.tokenizer_bridge.boundary import prefix_correction, prefix_index
from distill.tokenizer_bridge.granularity import vocab_bytes


@pytest.fixture(scope="module")
def tokenizers(tiny_zoo: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    return {
        "qwen": AutoTokenizer.from_pretrained(str(tiny_zoo.tok_qwen)),
        "llama": AutoTokenizer.from_pretrained(str(tiny_zoo.tok_llama)),
    }


@pytest.mark.parametrize("name", ["qwen", "llama"])
def test_prefix_ranges_hold_exactly_the_extensions(tokenizers: dict[str, Any], name: str) -> None:
    tok = tokenizers[name]
    index = prefix_index(tok)
    data = {i: b for i, b in vocab_bytes(tok).items() if isinstance(b, bytes) and b}
    rank = index.rank_V.tolist()
    for a, bytes_a in data.items():
        inside = {v for v in data if index.lo_V[a] <= rank[v] < index.hi_V[a]}
        assert inside == {v for v, b in data.items() if b.startswith(bytes_a)}, (a, bytes_a)


def test_the_correction_adds_the_mass_of_extending_tokens_only(tokenizers: dict[str, Any]) -> None:
    tok = tokenizers["llama"]
    index = prefix_index(tok)
    data = {i: b for i, b in vocab_bytes(tok).items() if isinstance(b, bytes) and b}
    # A token with an extension in this vocabulary, one extension, and a token that is neither.
    a = next(i for i, b in data.items() if any(o != b and o.startswith(b) for o in data.values()))
    ext = next(v for v, b in data.items() if v != a and b.startswith(data[a]))
    other = next(v for v, b in data.items() if not b.startswith(data[a]))
    logp = torch.tensor([[math.log(0.1)]])
    topk_ids = torch.tensor([[[a, ext, other]]])
    topk_logps = torch.log(torch.tensor([[[0.1, 0.5, 0.2]]]))
    c = prefix_correction(index, torch.tensor([[a]]), logp, topk_ids, topk_logps)
    assert float(c) == pytest.approx(math.log(0.6 / 0.1), rel=1e-5)
    # The token itself absent from the top-k still counts; a token with no extension gets 0.
    c = prefix_correction(index, torch.tensor([[a]]), logp, topk_ids[..., 1:], topk_logps[..., 1:])
    assert float(c) == pytest.approx(math.log(0.6 / 0.1), rel=1e-5)
    leaf = next(i for i, b in data.items() if not any(o != b and o.startswith(b) for o in data.values()))
    c = prefix_correction(index, torch.tensor([[leaf]]), logp, topk_ids, topk_logps)
    assert float(c) == 0.0


def test_signatures_tell_boundaries_that_differ(tokenizers: dict[str, Any]) -> None:
    qwen, llama = tokenizers["qwen"], tokenizers["llama"]
    q, same, lam = prefix_index(qwen), prefix_index(qwen), prefix_index(llama)
    assert q.signature == same.signature  # one tokenizer: every boundary means the same
    by_bytes = {b: i for i, b in vocab_bytes(qwen).items() if isinstance(b, bytes)}
    differ = [
        b
        for i, b in vocab_bytes(llama).items()
        if isinstance(b, bytes) and b in by_bytes and lam.signature[i] != q.signature[by_bytes[b]]
    ]
    assert differ, "the two zoo vocabularies extend some shared token differently"
