"""The zoo's sentencepiece family (`zoo:tok-mistral`, `zoo:teacher-mistral`): Mistral-7B-Instruct-v0.3's
vocabulary read offline, its training examples written in place, its 32k-row head trained chunked."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from conftest import tiny_domain

from distill.domains import build_domain
from distill.engines.base import render_chat
from distill.tokenizer_bridge.bridge import end_of_turn, role_tokens
from distill.zoo.batches import CHUNKED_HEAD_ROWS, padded_batch, step_loss
from distill.zoo.build import make_model, supervised_examples
from distill.zoo.recipes import RECIPES, ModelRecipe, TokenizerRecipe
from distill.zoo.tokenizers import shipped_tokenizer


@pytest.fixture(scope="module")
def mistral() -> Any:
    return shipped_tokenizer("mistral")


def test_tok_mistral_is_the_v03_vocabulary_with_its_turns(mistral: Any) -> None:
    recipe = RECIPES["tok-mistral"]
    assert isinstance(recipe, TokenizerRecipe) and len(mistral) == recipe.vocab_size == 32_768
    assert mistral.convert_ids_to_tokens([1, 2, 3, 4]) == ["<s>", "</s>", "[INST]", "[/INST]"]
    # `[INST]` and `[/INST]` are control tokens, the reply's space its first token's `▁`.
    prompt = mistral(render_chat(mistral, "Sort 4 2"), add_special_tokens=False)["input_ids"]
    assert mistral.convert_ids_to_tokens(prompt) == ["<s>", "[INST]", "▁Sort", "▁", "4", "▁", "2", "[/INST]"]
    assert end_of_turn(mistral) == "</s>"
    assert {k: v[0] for k, v in role_tokens(mistral).items()} == {
        "eos": "</s>",
        "end": "</s>",
        "bos": "<s>",
        "pad": "<unk>",
    }
    teacher = RECIPES["teacher-mistral"]
    assert isinstance(teacher, ModelRecipe) and teacher.tokenizer == "tok-mistral"


def test_corrupted_solutions_are_written_in_place(mistral: Any) -> None:
    """A corrupted worked solution is encoded segment by segment: each after the ones before it,
    so the example reads as the solution's text (alone, each segment would start with a space)."""
    domain = build_domain(tiny_domain())
    items = [item for item in domain.train_items()[:24] if item.solution]
    examples = supervised_examples(mistral, domain, items, corrupt_prob=1.0, seed=3)
    rng = random.Random(3)  # the same draws: one for the corruption, then the segments
    for item, (ids, labels) in zip(items, examples, strict=True):
        rng.random()
        text = "".join(t for t, _ in domain.solution_segments(item, rng))
        start = next(i for i, label in enumerate(labels) if label != -100 or i > len(ids) - 2)
        prompt_len = len(mistral(render_chat(mistral, item.prompt), add_special_tokens=False)["input_ids"])
        assert start >= prompt_len
        response = ids[prompt_len:-1]  # the eos closes it
        assert mistral.decode(response) == text


def test_a_large_head_trains_through_the_chunked_head() -> None:
    """Above CHUNKED_HEAD_ROWS the zoo's CE never builds [B, T, V] logits: the chunked head on the
    labelled positions gives the model's own loss and gradients."""
    recipe = ModelRecipe(
        arch="llama", tokenizer="", hidden=16, layers=1, heads=1, kv_heads=1, head_dim=16,
        intermediate=32, steps=1, lr=1e-3, batch_size=2, vocab_size=CHUNKED_HEAD_ROWS + 1,
    )  # fmt: skip

    class Tok:
        eos_token_id, pad_token_id, bos_token_id = 1, 0, 2

    torch.manual_seed(0)
    model = make_model(recipe, Tok())
    batch = [([5, 6, 7, 8, 9], [-100, -100, 7, 8, 9]), ([5, 10, 11], [-100, 10, 11])]
    chunked = step_loss(model, batch, recipe, 0)
    (grad_chunked,) = torch.autograd.grad(chunked, [model.lm_head.weight])
    own = model(**padded_batch(batch, 0), use_cache=False).loss
    (grad_own,) = torch.autograd.grad(own, [model.lm_head.weight])
    assert torch.allclose(chunked, own, atol=1e-5)
    assert torch.allclose(grad_chunked, grad_own, atol=1e-6)
