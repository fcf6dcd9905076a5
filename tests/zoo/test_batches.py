"""A zoo step's layouts (padded, packed, shared prefix) train on one objective: equal loss and gradients."""

from __future__ import annotations

from typing import Any

import pytest

from distill.zoo.recipes import ModelRecipe


def _model_and_tokenizer(tiny_zoo: Any, arch: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoTokenizer

    from distill.zoo.build import make_model

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    recipe = ModelRecipe(
        arch=arch, tokenizer="tok-qwen", hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64,
        steps=1, lr=1e-3, batch_size=7,
    )  # fmt: skip
    torch.manual_seed(0)
    return make_model(recipe, tok), tok


def _loss_and_grads(model: Any, loss_of: Any) -> tuple[Any, list[Any]]:
    model.zero_grad()
    loss = loss_of()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _assert_same(a: tuple[Any, list[Any]], b: tuple[Any, list[Any]]) -> None:
    import torch

    torch.testing.assert_close(b[0], a[0], rtol=1e-5, atol=1e-6)
    for ga, gb in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_packed_batch_gives_the_padded_loss_and_gradients(tiny_zoo: Any, arch: str) -> None:
    """`pack: true` trains on the same objective: loss and every gradient equal the padded batch's,
    so no token attends across the examples sharing a row and no label crosses a seam."""
    import torch

    from distill.zoo.batches import packed_batch, padded_batch

    model, tok = _model_and_tokenizer(tiny_zoo, arch)
    gen = torch.Generator().manual_seed(1)
    batch = []
    for n in (23, 5, 17, 9, 30, 2, 12):  # uneven: several examples share a row, one row is alone
        ids = torch.randint(5, len(tok), (n,), generator=gen).tolist()
        prompt = n // 3
        batch.append((ids, [-100] * prompt + ids[prompt:]))
    packed, padded = packed_batch(batch, tok.pad_token_id), padded_batch(batch, tok.pad_token_id)
    assert packed["input_ids"].shape == (4, 30)  # 98 tokens in rows of 30 instead of 7 rows
    _assert_same(
        _loss_and_grads(model, lambda: model(**padded, use_cache=False).loss),
        _loss_and_grads(model, lambda: model(**packed, use_cache=False).loss),
    )
    # Same labelled tokens: each example's labels once, none at a seam.
    assert int((packed["labels"] != -100).sum()) == sum(sum(x != -100 for x in lab[1:]) for _, lab in batch)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_shared_prefix_gives_the_padded_loss_and_gradients(tiny_zoo: Any, arch: str) -> None:
    """`share_prefix: true` runs the common prefix once: the same loss and gradients as padded
    rows, with prefix labels that differ between examples, uneven tails and one tail of a token."""
    import torch

    from distill.zoo.batches import common_prefix_length, padded_batch, shared_prefix_loss

    model, tok = _model_and_tokenizer(tiny_zoo, arch)
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(5, len(tok), (11,), generator=gen).tolist()
    batch = []
    for row, n in enumerate((9, 1, 14, 4)):
        ids = prefix + torch.randint(5, len(tok), (n,), generator=gen).tolist()
        # Row 0 labels everything, the others only part of the prefix, and row 3 none of it.
        start = (0, 4, 7, 11)[row]
        batch.append((ids, [-100] * start + ids[start:]))
    assert common_prefix_length(batch) == 11
    padded = padded_batch(batch, tok.pad_token_id)
    _assert_same(
        _loss_and_grads(model, lambda: model(**padded, use_cache=False).loss),
        _loss_and_grads(model, lambda: shared_prefix_loss(model, batch, tok.pad_token_id)),
    )


def test_the_common_prefix_leaves_every_example_a_token_of_its_own() -> None:
    from distill.zoo.batches import common_prefix_length

    assert common_prefix_length([([1, 2, 3], []), ([1, 2, 3, 4], [])]) == 2
    assert common_prefix_length([([1, 2, 3], []), ([1, 5, 3], [])]) == 1
    assert common_prefix_length([([7, 2], []), ([1, 2], [])]) == 0


@pytest.mark.parametrize("share_prefix", [False, True])
def test_the_fit_loop_runs_the_layout_its_recipe_names(tiny_zoo: Any, share_prefix: bool) -> None:
    """`fit_examples` on a recipe with `share_prefix` runs the common prefix through the model
    once per step (counted at the embedding), and every row in full without it."""
    import torch

    from distill.zoo.build import fit_examples

    model, tok = _model_and_tokenizer(tiny_zoo, "qwen3")
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(5, len(tok), (40,), generator=gen).tolist()
    examples = [
        (ids, list(ids))
        for ids in (prefix + torch.randint(5, len(tok), (6,), generator=gen).tolist() for _ in range(3))
    ]
    recipe = ModelRecipe(
        arch="qwen3", tokenizer="tok-qwen", hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64,
        steps=2, lr=1e-3, batch_size=4, warmup_steps=1, share_prefix=share_prefix,
    )  # fmt: skip
    tokens: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, inp, _o: tokens.append(inp[0].numel())
    )
    try:
        loss = fit_examples(model, tok, examples, recipe, 4, "fit", show_progress=False)
    finally:
        hook.remove()
    assert loss == loss  # a number, not NaN
    # 2 steps of 4 rows of 46 tokens; shared: each step 40 prefix tokens once, then 4 tails of 6.
    assert tokens == ([40, 24] * 2 if share_prefix else [4 * 46] * 2)
