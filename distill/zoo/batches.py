"""How a zoo training step lays out its examples: padded rows, packed rows, or a shared prefix.

All three give the same loss and gradients (tests/zoo/test_batches.py); they differ in the
compute spent on padding and on tokens every example repeats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from distill.zoo.recipes import ModelRecipe

Example = tuple[list[int], list[int]]  # token ids and their labels (-100: no loss)
# Above this many rows the model's own loss would hold [B, T, V] logits (gigabytes at a 32k
# vocabulary) and spend most of a step on positions without a label: the CE runs through the
# chunked head on the labelled positions instead (kernels/states.py). The trained families'
# 1-2k-row heads keep the model's own loss, so their builds stay exactly as they were.
CHUNKED_HEAD_ROWS = 8192


def step_loss(model: Any, batch: list[Example], recipe: ModelRecipe, pad_id: int) -> torch.Tensor:
    """The mean CE over the batch's labelled tokens, laid out as the recipe says."""
    if model.config.vocab_size > CHUNKED_HEAD_ROWS and not recipe.pack:
        from distill.kernels.states import ce_loss

        return ce_loss(model, model, padded_batch(batch, pad_id))
    if recipe.share_prefix and len(batch) > 1 and common_prefix_length(batch) > 0:
        return shared_prefix_loss(model, batch, pad_id)
    inputs = packed_batch(batch, pad_id) if recipe.pack else padded_batch(batch, pad_id)
    return model(**inputs, use_cache=False).loss


def common_prefix_length(batch: list[Example]) -> int:
    """Tokens every example starts with, leaving each at least one token of its own."""
    first = batch[0][0]
    n = min(len(ids) for ids, _ in batch) - 1
    for ids, _ in batch[1:]:
        n = next((i for i in range(n) if ids[i] != first[i]), n)
    return max(n, 0)


def shared_prefix_loss(model: Any, batch: list[Example], pad_id: int) -> torch.Tensor:
    """The padded batch's loss, with the tokens all examples start with run once.

    The prefix (SciWorld: the system prompt, the action list and the first turns, about half of
    each episode) goes through the model as one row; its KV cache, repeated per example, is what
    the rest of each row attends to. The forward is the padded one's, so are loss and gradients;
    the prefix's labels still count once per example (they may differ between examples).
    """
    import torch
    from transformers import DynamicCache

    n, width_P = len(batch), common_prefix_length(batch)
    width_S = max(len(ids) for ids, _ in batch) - width_P
    pre = model(input_ids=torch.tensor([batch[0][0][:width_P]]), cache=DynamicCache(), use_cache=True)
    cache = pre.cache
    cache.batch_repeat_interleave(n)
    ids_B_S = torch.full((n, width_S), pad_id, dtype=torch.long)
    mask_B_L = torch.zeros((n, width_P + width_S), dtype=torch.long)
    # Targets of each logit: position t predicts token t + 1 (-100: no loss, as HF's shift).
    targets_B_P = torch.full((n, width_P), -100, dtype=torch.long)
    targets_B_S = torch.full((n, width_S), -100, dtype=torch.long)
    for row, (ids, labels) in enumerate(batch):
        ids_B_S[row, : len(ids) - width_P] = torch.tensor(ids[width_P:])
        mask_B_L[row, : len(ids)] = 1
        targets_B_P[row] = torch.tensor(labels[1 : width_P + 1])
        targets_B_S[row, : len(ids) - width_P - 1] = torch.tensor(labels[width_P + 1 :])
    positions_B_S = (width_P + torch.arange(width_S)).expand(n, width_S)
    out = model(
        input_ids=ids_B_S, attention_mask=mask_B_L, position_ids=positions_B_S, cache=cache, use_cache=True
    )
    logprobs_P_V = pre.logits[0].float().log_softmax(-1)
    nll_B_P = -logprobs_P_V.gather(-1, targets_B_P.clamp(min=0).T).T
    nll_B_S = torch.nn.functional.cross_entropy(
        out.logits.float().transpose(1, 2), targets_B_S, ignore_index=-100, reduction="none"
    )
    labelled = int((targets_B_P != -100).sum() + (targets_B_S != -100).sum())
    total = nll_B_P[targets_B_P != -100].sum() + nll_B_S.sum()
    return total / max(labelled, 1)


def padded_batch(batch: list[Example], pad_id: int) -> dict[str, Any]:
    """One row per example, right-padded to the longest."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids_B_T = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels_B_T = torch.full((len(batch), width), -100, dtype=torch.long)
    mask_B_T = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labels) in enumerate(batch):
        ids_B_T[row, : len(ids)] = torch.tensor(ids)
        labels_B_T[row, : len(labels)] = torch.tensor(labels)
        mask_B_T[row, : len(ids)] = 1
    return {"input_ids": ids_B_T, "attention_mask": mask_B_T, "labels": labels_B_T}


def packed_batch(batch: list[Example], pad_id: int) -> dict[str, Any]:
    """The examples packed first-fit, longest first, into rows as wide as the longest one.
    Position ids restart at 0 with each example, and with no attention mask transformers turns
    the restarts into a block-diagonal causal mask, so no token attends across examples. Each
    example's first label is dropped: it would be predicted from the previous example's last
    token (a causal LM never predicts a sequence's first token, so the padded loss lacks it too)."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    rows: list[list[Example]] = []
    free: list[int] = []
    for example in sorted(batch, key=lambda e: -len(e[0])):
        fit = next((r for r, room in enumerate(free) if room >= len(example[0])), None)
        if fit is None:
            rows.append([])
            free.append(width)
            fit = len(rows) - 1
        rows[fit].append(example)
        free[fit] -= len(example[0])
    ids_R_W = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels_R_W = torch.full((len(rows), width), -100, dtype=torch.long)
    positions_R_W = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for ids, labels in row:
            n = len(ids)
            ids_R_W[r, at : at + n] = torch.tensor(ids)
            labels_R_W[r, at + 1 : at + n] = torch.tensor(labels[1:n])
            positions_R_W[r, at : at + n] = torch.arange(n)
            at += n
        # The tail's padding is a sequence of its own (positions restart), attended by nothing.
        positions_R_W[r, at:] = torch.arange(width - at)
    return {"input_ids": ids_R_W, "position_ids": positions_R_W, "labels": labels_R_W}
