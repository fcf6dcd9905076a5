"""HFEngine on the tiny zoo teacher: chat rendering, exact scoring, generation and EOS handling."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from distill.config import Sampling
from distill.engines.base import Completion
from distill.engines.hf import HFEngine

PROMPTS = ["What is 3 times 4?", "Sort: 3 1 2", "hello"]


@pytest.fixture(scope="module")
def engine(tiny_zoo: Any) -> HFEngine:
    return HFEngine.load(str(tiny_zoo.teacher))


@contextmanager
def eos_bias(engine: HFEngine, rows: set[int], from_call: int) -> Iterator[None]:
    """Make the model emit the tokenizer's EOS for `rows` from the `from_call`-th forward on."""
    eos = engine.tokenizer.eos_token_id
    calls = {"n": 0}

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] < from_call:
            return output
        output = output.clone()
        for r in rows:
            output[r, :, eos] += 1e4
        return output

    handle = engine.model.lm_head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def test_load(engine: HFEngine, tiny_zoo: Any) -> None:
    assert not engine.model.training
    assert engine.model.dtype == torch.float32
    assert engine.tokenizer.pad_token_id is not None
    assert engine.tokenizer.eos_token == "<|im_end|>"
    assert engine.tokenizer.eos_token_id in engine.eos_ids
    bf16 = HFEngine.load(str(tiny_zoo.teacher), precision="bf16")
    assert bf16.model.dtype == torch.bfloat16


def test_load_keeps_the_weights_bar_out(tiny_zoo: Any, capfd: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    capfd.readouterr()
    AutoModelForCausalLM.from_pretrained(tiny_zoo.teacher)
    assert "Loading weights" in capfd.readouterr().err  # what `distill eval` used to print
    HFEngine.load(str(tiny_zoo.teacher))
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_render_ends_with_assistant_header(engine: HFEngine) -> None:
    text = engine.render("hi there")
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    with_system = engine.render("hi", system="be brief")
    assert with_system.startswith("<|im_start|>system\nbe brief<|im_end|>\n")
    assert with_system.endswith("<|im_start|>assistant\n")
    assert "<think>" not in text


def test_render_enable_thinking(engine: HFEngine) -> None:
    off = HFEngine(engine.model, engine.tokenizer, enable_thinking=False)
    assert off.render("hi").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = HFEngine(engine.model, engine.tokenizer, enable_thinking=True)
    assert on.render("hi") == engine.render("hi")


def test_prompt_ids_use_single_special_ids(engine: HFEngine) -> None:
    ids = engine.prompt_ids("hi")
    start = engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[0] == start
    assert ids.count(start) == 2 and ids.count(end) == 1
    assert engine.tokenizer.decode(ids) == engine.render("hi")


def _manual_logprobs(engine: HFEngine, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits.float()
    logprobs = torch.log_softmax(logits[0], dim=-1)
    p = len(prompt)
    return [float(logprobs[p - 1 + j, tok]) for j, tok in enumerate(completion)]


def test_score_matches_manual_forward(engine: HFEngine) -> None:
    prompt = engine.prompt_ids(PROMPTS[0])
    completion = engine.encode("3 * 4: 4, 8, 12.\n\\boxed{12}") + [engine.tokenizer.eos_token_id]
    (row,) = engine.score([prompt], [completion]).rows()
    assert len(row) == len(completion)
    assert row == pytest.approx(_manual_logprobs(engine, prompt, completion), abs=1e-5)
    assert all(lp <= 0 for lp in row)


def test_score_lengths_and_padding_invariance(engine: HFEngine) -> None:
    prompts = [engine.prompt_ids(p) for p in PROMPTS]
    completions = [
        engine.encode("12"),
        engine.encode("smallest 1, left 3 2.\nsmallest 2, left 3.\nsmallest 3, left none.\n\\boxed{1 2 3}"),
        [],
    ]
    batched = engine.score(prompts, completions).rows()
    assert [len(r) for r in batched] == [len(c) for c in completions]
    assert all(lp <= 0 for row in batched for lp in row)
    for i in range(2):
        (alone,) = engine.score([prompts[i]], [completions[i]]).rows()
        assert batched[i] == pytest.approx(alone, abs=1e-4)
    # Small batches give the same as one batch.
    one_by_one = engine.score(prompts, completions, batch_size=1).rows()
    assert [len(r) for r in one_by_one] == [len(r) for r in batched]
    for got, want in zip(one_by_one, batched, strict=True):
        assert got == pytest.approx(want, abs=1e-4)


def test_score_mismatched_counts(engine: HFEngine) -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        engine.score([[1, 2], [3, 4]], [[5]])


def test_score_empty_prompt_is_an_error_not_a_silent_cut(engine: HFEngine) -> None:
    # The first token of a row has no predecessor: it cannot be scored.
    with pytest.raises(ValueError, match="row 0 has an empty prompt"):
        engine.score([[]], [engine.encode("12")])


def test_greedy_generate_is_deterministic(engine: HFEngine) -> None:
    prompts = [engine.prompt_ids(p) for p in PROMPTS]
    first = engine.generate(prompts, Sampling(6))
    second = engine.generate(prompts, Sampling(6))
    assert first == second
    assert len(first) == len(prompts)
    for comp in first:
        assert isinstance(comp, Completion)
        assert 1 <= len(comp.ids) <= 6
        assert comp.text == engine.tokenizer.decode(comp.ids, skip_special_tokens=True)


def test_generate_budget_one_token(engine: HFEngine) -> None:
    prompts = [engine.prompt_ids(p) for p in PROMPTS]
    out = engine.generate(prompts, Sampling(1))
    assert all(len(c.ids) == 1 for c in out)
    for c in out:
        assert c.truncated == (c.ids[-1] not in engine.eos_ids)
    assert any(c.truncated for c in out)


def test_generate_progress_counts_rows(engine: HFEngine) -> None:
    seen: list[int] = []
    prompts = [engine.prompt_ids(p) for p in PROMPTS]
    engine.generate(prompts, Sampling(1), batch_size=2, progress=seen.append)
    assert seen == [2, 1]


def test_sampling_with_temperature_gives_full_rows(engine: HFEngine) -> None:
    torch.manual_seed(0)
    out = engine.generate([engine.prompt_ids("hello")] * 4, Sampling(4, 1.0))
    assert len(out) == 4
    for c in out:
        assert 1 <= len(c.ids) <= 4
        assert c.truncated == (len(c.ids) == 4 and c.ids[-1] not in engine.eos_ids)


def test_eos_is_kept_in_ids_not_in_text_and_not_truncated(engine: HFEngine) -> None:
    eos = engine.tokenizer.eos_token_id
    prompts = [engine.prompt_ids(p) for p in PROMPTS[:2]]
    # Row 0 emits EOS as its 3rd token (3rd forward: prefill + 2 decode steps); row 1 never does.
    with eos_bias(engine, rows={0}, from_call=3):
        out = engine.generate(prompts, Sampling(6))
    ended, running = out
    assert ended.ids[-1] == eos
    assert len(ended.ids) == 3
    assert eos not in ended.ids[:-1]
    assert ended.truncated is False
    assert "<|im_end|>" not in ended.text
    assert ended.text == engine.tokenizer.decode(ended.ids[:-1], skip_special_tokens=True)
    # The padding generate() writes after row 0's EOS is not part of its completion.
    assert engine.tokenizer.pad_token_id not in ended.ids
    assert running.truncated is True
    assert len(running.ids) == 6 and eos not in running.ids


def test_eos_as_first_token(engine: HFEngine) -> None:
    eos = engine.tokenizer.eos_token_id
    with eos_bias(engine, rows={0}, from_call=1):
        (comp,) = engine.generate([engine.prompt_ids("hi")], Sampling(5))
    assert comp.ids == [eos]
    assert comp.text == ""
    assert comp.truncated is False


def test_generation_config_eos_counts_as_eos(tiny_zoo: Any) -> None:
    eng = HFEngine.load(str(tiny_zoo.teacher))
    prompt = eng.prompt_ids(PROMPTS[0])
    (free,) = eng.generate([prompt], Sampling(4))
    first = free.ids[0]
    assert first not in eng.eos_ids
    eng.model.generation_config.eos_token_id = [eng.tokenizer.eos_token_id, first]
    assert first in eng.eos_ids
    (stopped,) = eng.generate([prompt], Sampling(4))
    assert stopped.ids == [first]
    assert stopped.truncated is False


def test_score_of_own_generation_is_consistent(engine: HFEngine) -> None:
    # Greedy tokens are the argmax, so their logprob is the max over the vocabulary.
    prompt = engine.prompt_ids(PROMPTS[1])
    (comp,) = engine.generate([prompt], Sampling(5))
    (row,) = engine.score([prompt], [comp.ids]).rows()
    ids = torch.tensor([prompt + comp.ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(engine.model(input_ids=ids).logits[0].float(), dim=-1)
    for j in range(len(comp.ids)):
        assert row[j] == pytest.approx(float(logprobs[len(prompt) - 1 + j].max()), abs=1e-4)


def test_missing_pad_token_is_rejected(engine: HFEngine) -> None:
    class NoPad:
        pad_token_id = None

    with pytest.raises(ValueError, match="no pad token"):
        HFEngine(engine.model, NoPad())  # type: ignore[arg-type]


def test_continue_generate_reuses_the_cache_and_matches_generate(engine: HFEngine) -> None:
    """A multi-turn sequence continued from its last turn's cache: only the new tokens are
    prefilled, and each greedy turn equals a fresh generate on the whole sequence."""
    fed: list[int] = []
    handle = engine.model.model.embed_tokens.register_forward_hook(
        lambda module, args, output: fed.append(args[0].shape[1])
    )
    try:
        seq = engine.prompt_ids(PROMPTS[0])
        cache = None
        for observation in ["Sort: 3 1 2", "hello there", ""]:
            fed.clear()
            comp, new_cache = engine.continue_generate(seq, cache, Sampling(5))
            prefill = fed[0]
            assert prefill == (len(seq) if cache is None else len(seq) - len(cache.ids))
            assert comp == engine.generate([seq], Sampling(5))[0]
            # The cache holds the sequence and all but the last generated token (never fed back).
            assert new_cache.ids == (seq + comp.ids)[:-1]
            assert new_cache.past.get_seq_length() == len(new_cache.ids)
            cache = new_cache
            seq = seq + comp.ids + engine.encode(observation or "ok")
    finally:
        handle.remove()
    assert 0 < prefill < len(seq) // 2


def test_continue_generate_drops_a_cache_that_is_not_a_prefix(engine: HFEngine) -> None:
    a = engine.prompt_ids(PROMPTS[0])
    b = engine.prompt_ids(PROMPTS[1])
    _, cache_a = engine.continue_generate(a, None, Sampling(3))
    comp, cache_b = engine.continue_generate(b, cache_a, Sampling(3))
    assert comp == engine.generate([b], Sampling(3))[0]
    assert cache_b.ids[: len(b)] == b


def test_load_puts_the_model_on_its_device_and_describes_it(engine: HFEngine, tiny_zoo: Any) -> None:
    assert engine.describe()["device"] == "cpu"
    # The meta device stands in for a GPU here: load moves the weights wherever it is told.
    moved = HFEngine.load(str(tiny_zoo.teacher), device="meta")
    assert {p.device.type for p in moved.model.parameters()} == {"meta"}
    assert moved.describe()["device"] == "meta"


def test_each_prompt_gets_the_room_its_own_length_leaves(tiny_zoo: Any) -> None:
    """A prompt one token short of the context caps itself, not its batch-mates (eval.overlong=skip
    keeps such prompts), and the budget check counts exactly the rows that are capped."""
    from distill.engines.context import check_budget

    engine = HFEngine.load(str(tiny_zoo.teacher))
    prompts = [
        engine.prompt_ids(p) for p in (*PROMPTS, "Sort: 9 8 7 6 5 4 3 2 1 0 and then add them all up.")
    ]
    lengths = [len(p) for p in prompts]
    engine.model.config.max_position_embeddings = max(lengths) + 1  # the longest has room for 1
    assert engine.context == max(lengths) + 1
    budget = max(lengths) - min(lengths) - 1  # the shortest prompt has room for all of it
    # Never the EOS: every row runs to the tokens it may have.
    out = engine.generate(prompts, Sampling(budget), batch_size=64, suppress_tokens=sorted(engine.eos_ids))
    room = [min(budget, engine.context - n) for n in lengths]
    assert [len(c.ids) for c in out] == room
    assert room.count(budget) >= 1 and min(room) == 1 and all(c.truncated for c in out)
    check = check_budget("eval.max_new_tokens", budget, engine.context, lengths, "eval")
    assert check.capped == sum(len(c.ids) < budget for c in out) == sum(r < budget for r in room)
