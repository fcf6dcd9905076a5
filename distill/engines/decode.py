"""A lean decode step for the batched turns of multi-turn play (engines/batched.py).

Each decode step of `continue_many` feeds one token per row. Through the transformers model
call a step of the embedded 2-layer student costs ~5 ms on CPU whatever the batch, nearly all
of it per-call machinery: the 4-D mask rebuilt from the 2-D one, the DynamicCache growing by
concatenation, output capturing, a dozen wrappers per layer. For the llama family (llama,
qwen2, qwen3) this module runs the same arithmetic on the model's own modules and weights:
keys and values go into buffers sized once per turn (the stacked caches plus the turn's
budget), and the padding mask is a boolean row per sequence that grows by one column a step.
Projections stay separate matmuls on the modules' own tensors: joining q, k and v (or gate and
up) into one saved ~4% a step on the embedded student but would copy every layer's weights each
turn, gigabytes on a real model whose weights change every training step. The prefill of each
turn's new tokens still goes through the model itself.

Same math, same order of operations: the logits match the model's own step to float
rounding (tests/engines/test_decode.py); any other model, or a model configured away from
plain full attention, keeps the transformers path (`lean_decoder` returns None).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

FAMILIES = frozenset({"llama", "qwen2", "qwen3"})


def lean_decoder(model: Any) -> Any | None:
    """The decoder stack of `model` (its `.model`) when this module can step it; else None.

    Only plain modules qualify: a LoRA-wrapped projection (its delta lives beside `.weight`), a
    quantised one or a sliding-window layer would be stepped wrongly, so they keep the model call."""
    config = getattr(model, "config", None)
    if config is None or config.model_type not in FAMILIES or getattr(config, "use_sliding_window", False):
        return None
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return None
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
        return None
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projs = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projs += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(p) is not torch.nn.Linear for p in projs) or getattr(attn, "sliding_window", None):
            return None
    return decoder


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The model's RMSNorm, inline: the same operations without a module call per norm."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def _linear(proj: Any, x: torch.Tensor) -> torch.Tensor:
    """A projection without its module call."""
    return F.linear(x, proj.weight, proj.bias)


class DecodeState:
    """The rows' keys and values after a turn's prefill, with room for `extra` more tokens."""

    def __init__(self, model: Any, past: Any, mask_B_L: torch.Tensor, extra: int) -> None:
        self.model = model
        self.decoder = model.model
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for layer in past.layers:
            batch, heads, _, dim = layer.keys.shape
            room = layer.keys.new_zeros((batch, heads, extra, dim))
            self.keys.append(torch.cat([layer.keys, room], dim=2))
            self.values.append(torch.cat([layer.values, room], dim=2))
        self.length = mask_B_L.shape[1]
        self.mask_B_L = torch.cat(
            [mask_B_L.bool(), mask_B_L.new_zeros((mask_B_L.shape[0], extra)).bool()], dim=1
        )

    def step(self, ids_B: torch.Tensor, pos_B: torch.Tensor, feed_B: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (rows with `feed_B` False feed a masked pad); next-token logits."""
        col = self.length
        self.mask_B_L[:, col] = feed_B
        self.length += 1
        attend_B_1_1_L = self.mask_B_L[:, None, None, : col + 1]
        x_B_1_H = self.decoder.embed_tokens(ids_B[:, None])
        cos_B_1_D, sin_B_1_D = self.decoder.rotary_emb(x_B_1_H, pos_B[:, None])
        cos_B_1_1_D, sin_B_1_1_D = cos_B_1_D[:, None], sin_B_1_D[:, None]
        batch = x_B_1_H.shape[0]
        for i, layer in enumerate(self.decoder.layers):
            attn, mlp, dim = layer.self_attn, layer.mlp, layer.self_attn.head_dim
            h_B_1_H = _norm(x_B_1_H, layer.input_layernorm)
            # [B, 1, heads, D]; N query heads, K key/value heads
            q_B_1_N_D, k_B_1_K_D, v_B_1_K_D = (
                _linear(proj, h_B_1_H).view(batch, 1, -1, dim)
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
            )
            if getattr(attn, "q_norm", None) is not None:  # qwen3 norms each head
                q_B_1_N_D, k_B_1_K_D = _norm(q_B_1_N_D, attn.q_norm), _norm(k_B_1_K_D, attn.k_norm)
            q_B_N_1_D, k_B_K_1_D = q_B_1_N_D.transpose(1, 2), k_B_1_K_D.transpose(1, 2)
            q_B_N_1_D = q_B_N_1_D * cos_B_1_1_D + _rotate_half(q_B_N_1_D) * sin_B_1_1_D
            k_B_K_1_D = k_B_K_1_D * cos_B_1_1_D + _rotate_half(k_B_K_1_D) * sin_B_1_1_D
            self.keys[i][:, :, col] = k_B_K_1_D[:, :, 0]
            self.values[i][:, :, col] = v_B_1_K_D[:, 0]
            out_B_N_1_D = F.scaled_dot_product_attention(
                q_B_N_1_D,
                self.keys[i][:, :, : col + 1],
                self.values[i][:, :, : col + 1],
                attn_mask=attend_B_1_1_L,
                scale=attn.scaling,
                enable_gqa=True,
            )
            x_B_1_H = x_B_1_H + _linear(attn.o_proj, out_B_N_1_D.transpose(1, 2).reshape(batch, 1, -1))
            h_B_1_H = _norm(x_B_1_H, layer.post_attention_layernorm)
            gate_B_1_I = mlp.act_fn(_linear(mlp.gate_proj, h_B_1_H))
            x_B_1_H = x_B_1_H + _linear(mlp.down_proj, gate_B_1_I * _linear(mlp.up_proj, h_B_1_H))
        return self.model.lm_head(_norm(x_B_1_H, self.decoder.norm))[:, -1]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) per layer over the columns written so far."""
        return [
            (k[:, :, : self.length], v[:, :, : self.length])
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def mask(self) -> torch.Tensor:
        return self.mask_B_L[:, : self.length].long()
