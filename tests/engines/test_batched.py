"""Batched continuation (engines/batched.py): many episodes' turns at once, each from its own KV
cache, give what continuing them one at a time gives, and leave the same caches behind."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distill.config import Sampling
from distill.engines.base import KVCache
from distill.engines.batched import _reusable, sample
from distill.engines.hf import HFEngine


@pytest.fixture(scope="module")
def engine(tiny_zoo: Any) -> HFEngine:
    return HFEngine.load(str(tiny_zoo.teacher))


def _episodes(engine: HFEngine) -> list[list[int]]:
    texts = ["Sort: 3 1 2", "Add 2 and 5, then double it.", "Hi", "Count the vowels in 'banana' please."]
    return [engine.prompt_ids(t) for t in texts]


def _keys(cache: KVCache) -> list[torch.Tensor]:
    return [layer.keys for layer in cache.past.layers]


def test_batched_turns_match_one_at_a_time_with_their_caches(engine: HFEngine) -> None:
    firsts = _episodes(engine)
    # Turn 1: half the episodes already hold a cache of an earlier turn, half start cold.
    warm: list[KVCache | None] = [None] * len(firsts)
    for i in (0, 2):
        _, warm[i] = engine.continue_generate(firsts[i][:-3], None, Sampling(4))
    seq = [engine.continue_generate(ids, c, Sampling(12)) for ids, c in zip(firsts, warm, strict=True)]
    bat = engine.continue_many(firsts, warm, Sampling(12))
    for (c1, k1), (c2, k2) in zip(seq, bat, strict=True):
        assert c2.ids == c1.ids and c2.text == c1.text and c2.truncated == c1.truncated
        assert k2.ids == k1.ids
        for a, b in zip(_keys(k1), _keys(k2), strict=True):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    # Turn 2 from the batched caches: an observation appended to each episode.
    seconds = [
        ids + c.ids + engine.encode("\nObservation: ok.\n") for ids, (c, _) in zip(firsts, bat, strict=True)
    ]
    again_seq = [
        engine.continue_generate(ids, k, Sampling(10)) for ids, (_, k) in zip(seconds, seq, strict=True)
    ]
    again_bat = engine.continue_many(seconds, [k for _, k in bat], Sampling(10))
    assert [c.ids for c, _ in again_bat] == [c.ids for c, _ in again_seq]


def test_budget_per_row_and_full_context(engine: HFEngine) -> None:
    rows = _episodes(engine)
    context = engine.context
    assert context is not None
    rows[1] = rows[1] + [rows[1][-1]] * (context - len(rows[1]) - 2)  # room for 2 tokens only
    rows[3] = rows[3] + [rows[3][-1]] * (context - len(rows[3]))  # no room at all
    out = engine.continue_many(rows, [None] * len(rows), Sampling(8))
    assert len(out[1][0].ids) <= 2
    assert out[3][0].ids == [] and out[3][0].truncated
    assert len(out[0][0].ids) <= 8


def test_sample_keeps_to_the_nucleus() -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    drawn = sample(logits, 1.0, 0.7)
    assert set(drawn.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7: the rest is cut
    share = (drawn == 0).float().mean().item()
    assert 0.55 < share < 0.70  # renormalised: 0.5 / 0.8 = 0.625
    assert sample(logits[:3], 0.0, 1.0).tolist() == [0, 0, 0]


def test_a_cache_that_runs_past_the_row_is_cut_to_the_shared_ids(engine: HFEngine) -> None:
    """A turn cut short after it was written (play.end_turn) leaves a cache holding ids the
    episode no longer has: its shared part is reused, and the turn is what a cold start gives."""
    rows = _episodes(engine)
    first = engine.continue_many(rows, [None] * len(rows), Sampling(12))
    # Each episode keeps 3 of its turn's ids, then goes on with other text.
    onward = engine.encode("\nObservation: the turn was cut.\n")
    seconds = [ids + c.ids[:3] + onward for ids, (c, _) in zip(rows, first, strict=True)]
    found = _reusable(seconds, [k for _, k in first])
    assert found is not None and found[1] == [len(ids) + 3 for ids in rows]  # the shared ids, reused
    reused = engine.continue_many(seconds, [k for _, k in first], Sampling(10))
    cold = engine.continue_many(seconds, [None] * len(seconds), Sampling(10))
    assert [c.ids for c, _ in reused] == [c.ids for c, _ in cold]
    for (_, k_reused), (_, k_cold) in zip(reused, cold, strict=True):
        assert k_reused.ids == k_cold.ids
        for a, b in zip(_keys(k_cold), _keys(k_reused), strict=True):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
