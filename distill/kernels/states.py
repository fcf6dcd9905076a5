"""Final hidden states, and what is computed from them: the decoder without its output head.

Every scoring and loss path applies the head itself, per chunk of positions (heads.py), so the
decoder's [B, T, H] states are the widest tensor a forward pass keeps: token logprobs of a
sequence, the CE of labelled tokens, the states at completion positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from distill.kernels.heads import (
    scatter_positions,
    select_positions,
    token_logprobs,
    token_logprobs_entropy,
)
from distill.kernels.sharded import head_call
from distill.launch import token_share, world_size

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def completion_states(
    model: PreTrainedModel,
    prompt_ids_B_P: torch.Tensor,
    prompt_mask_B_P: torch.Tensor,
    completion_ids_B_T: torch.Tensor,
    completion_mask_B_T: torch.Tensor,
) -> torch.Tensor:
    """Final hidden states aligned to completion tokens: row t is the state that predicts token t.

    Prompts are left-padded and completions right-padded, so the completion starts at the same
    column in every row and one slice serves the whole batch.
    """
    ids_B_L = torch.cat([prompt_ids_B_P, completion_ids_B_T], dim=1)
    mask_B_L = torch.cat([prompt_mask_B_P, completion_mask_B_T], dim=1)
    # The decoder stack without the head: the head is applied by the loss (possibly chunked).
    decoder = model.get_decoder()
    # use_cache=False: a scoring pass must not build a [layers, B, L, kv] cache it never reads.
    hidden_B_L_H = decoder(input_ids=ids_B_L, attention_mask=mask_B_L, use_cache=False).last_hidden_state
    width_P, width_T = prompt_ids_B_P.shape[1], completion_ids_B_T.shape[1]
    return hidden_B_L_H[:, width_P - 1 : width_P - 1 + width_T]


def decoder_states(model: Any, input_ids_B_L: torch.Tensor, attention_mask_B_L: torch.Tensor) -> torch.Tensor:
    """The final hidden states [B, L, H] of a training forward, without the head.

    One process: the decoder alone. Several: through the DDP wrapper's own forward, or DDP would
    not average the gradients; its `hidden_states[-1]` is bitwise the decoder's last_hidden_state
    (transformers 5), and `logits_to_keep=1` keeps the head off the sequence.
    """
    if world_size() == 1:
        out = model.get_decoder()(input_ids=input_ids_B_L, attention_mask=attention_mask_B_L, use_cache=False)
        return out.last_hidden_state
    out = model(
        input_ids=input_ids_B_L,
        attention_mask=attention_mask_B_L,
        output_hidden_states=True,
        logits_to_keep=1,
        use_cache=False,
    )
    return out.hidden_states[-1]


def sequence_logprobs(
    model: Any,
    head_model: Any,
    ids_B_L: torch.Tensor,
    attention_mask_B_L: torch.Tensor,
    scored_B_L: torch.Tensor,
) -> torch.Tensor:
    """Differentiable logprob of every token marked in `scored_B_L` (position t scores token t
    from the state at t-1), flat [N] in row-major order: hidden states once, head per chunk."""
    hidden_B_L_H = decoder_states(model, ids_B_L, attention_mask_B_L)
    scored = scored_B_L[:, 1:].bool()
    targets_N = ids_B_L[:, 1:][scored]
    return head_call(
        head_model,
        lambda hidden_N_H, weight, bias: token_logprobs(hidden_N_H, weight, bias, targets_N),
        select_positions(hidden_B_L_H[:, :-1], scored),
    )


def ce_loss(
    model: Any, head_model: Any, batch: dict[str, torch.Tensor], num_items: Any = None
) -> torch.Tensor:
    """Cross-entropy on the labelled tokens of (input_ids, attention_mask, labels) rows: the mean over
    labelled tokens, or their sum / `num_items` (the Trainer's count across accumulation and
    processes)."""
    labels_B_L = batch["labels"]
    labelled_B_L = labels_B_L != -100
    ids_B_L = batch["input_ids"]
    # Labels equal the ids where set (CE on the sequence's own tokens): score those positions.
    if not torch.equal(ids_B_L[labelled_B_L], labels_B_L[labelled_B_L]):
        raise ValueError("ce_loss: labels must be the input ids (or -100)")
    logprobs_N = sequence_logprobs(model, head_model, ids_B_L, batch["attention_mask"], labelled_B_L)
    total = -logprobs_N.sum()
    # Several processes: the data parallel wrapper averages their gradients, so each one's loss is
    # scaled to make that average the one-process loss over all of their tokens.
    if num_items is None:
        return total / max(logprobs_N.numel(), 1) * token_share(logprobs_N.numel(), total.device)
    # The Trainer's count is already over every process (average_tokens_across_devices), as
    # transformers' own loss scales it.
    return total / torch.as_tensor(num_items, device=total.device).clamp(min=1) * world_size()


def completion_logprobs(
    model: Any,
    head_model: Any,
    input_ids_B_L: torch.Tensor,
    attention_mask_B_L: torch.Tensor,
    width: int,
    temperature: float = 1.0,
    untempered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Differentiable logprobs [B, width] of the last `width` tokens of each row (the completion)
    at `temperature`, their entropies (no grad), and with `untempered` the logprobs at temperature 1
    (no grad; one more pass of the head over the same hidden states, None when temperature is 1
    anyway). What GRPOTrainer's per-token logps are, from the chunked head instead of TRL's fused
    head (whose CPU path holds [4096 tokens, 32768 vocab] fp32 tiles, ~1-2 GB at any length)."""
    hidden_B_L_H = decoder_states(model, input_ids_B_L, attention_mask_B_L)
    # Position t of the completion is predicted by the state just before it.
    mask_B_T = attention_mask_B_L[:, -width:].bool()
    hidden_N_H = select_positions(hidden_B_L_H[:, -width - 1 : -1], mask_B_T)
    targets_N = input_ids_B_L[:, -width:][mask_B_T]

    def passes(
        hidden_N_H: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        logprobs_N, entropy_N = token_logprobs_entropy(
            hidden_N_H, weight, bias, targets_N, temperature=temperature
        )
        plain_N = None
        if untempered and temperature != 1.0:
            with torch.no_grad():
                plain_N = token_logprobs(hidden_N_H, weight, bias, targets_N)
        return logprobs_N, entropy_N, plain_N

    # Both passes in one call: a sharded head is gathered once for them (sharded.py).
    logprobs_N, entropy_N, plain_N = head_call(head_model, passes, hidden_N_H)
    plain_B_T = None if plain_N is None else scatter_positions(plain_N, mask_B_T)
    return scatter_positions(logprobs_N, mask_B_T), scatter_positions(entropy_N, mask_B_T), plain_B_T
