"""Final hidden states at completion positions: the decoder without its output head.

Every scoring and loss path applies the head itself (per chunk of positions at real vocabulary
sizes), so the decoder's [B, T, H] states are the widest tensor a forward pass keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

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
    hidden_B_L_H = decoder(input_ids=ids_B_L, attention_mask=mask_B_L).last_hidden_state
    width_P, width_T = prompt_ids_B_P.shape[1], completion_ids_B_T.shape[1]
    return hidden_B_L_H[:, width_P - 1 : width_P - 1 + width_T]
