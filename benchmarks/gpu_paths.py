"""The steps benchmarks/gpu_step.py times: each part's distill path (the project's own code: the
hf engine's scoring, kernels/states.py, kernels/heads.py, kernels/losses.py, engines/batched.py),
the naive full-logits path, Liger-Kernel's fused linear losses where they import (CUDA), and
distill with its chunk loop's block arithmetic under torch.compile (CUDA). Every step function
returns the tensors the numerics compare; no optimizer step (gradients are set to None before
each call, so their allocation counts in the peak).

Models are Qwen3 shapes with random weights built from config on the device (nothing is
downloaded); a stand-in tokenizer carries the pad id (every step here works on ids).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from distill.kernels import heads, jsd, losses
from distill.kernels.heads import head_gather, head_gather_topk, output_head, select_positions
from distill.kernels.states import ce_loss, completion_logprobs, decoder_states

Step = Callable[[], dict[str, torch.Tensor]]


def qwen3_config(kind: str, smoke: bool) -> Any:
    """Qwen3-1.7B (`student`) or Qwen3-8B (`teacher`) as published, or a tiny one for --smoke."""
    from transformers import Qwen3Config

    common: dict[str, Any] = dict(
        rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, use_sliding_window=False,
        rope_theta=1_000_000.0, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    shape: dict[str, Any]
    if smoke:
        hidden = 64 if kind == "student" else 96
        shape = dict(vocab_size=1000, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                     max_position_embeddings=4096)  # fmt: skip
    elif kind == "student":
        shape = dict(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=40_960)  # fmt: skip
    else:
        shape = dict(vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=40_960)  # fmt: skip
    config = Qwen3Config(tie_word_embeddings=kind == "student", **shape, **common)
    config._attn_implementation = "sdpa"
    return config


def build(config: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """The model initialised directly on `device` in `dtype` (no fp32 copy anywhere)."""
    from transformers import Qwen3ForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model: Any = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    # Not .to(dtype): RoPE's inv_freq stays the fp32 it is computed in, as from_pretrained leaves it.
    if {p.dtype for p in model.parameters()} != {dtype}:
        model.to(dtype)
    return model.to(device)


class IdsOnly:
    """The tokenizer an HFEngine needs for steps on ids: a pad id, no EOS, no text."""

    pad_token_id = 0
    eos_token_id = None
    chat_template = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""


def liger_problem(device: torch.device) -> str | None:
    """Why Liger's fused losses cannot run here (None: they can)."""
    if device.type != "cuda":
        return "Liger-Kernel is Triton/CUDA only"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed (pip install 'distill[gpu]')"
    return None


@dataclass
class Batch:
    """One on-policy batch: B rows of P prompt + T completion tokens, with synthetic teacher
    targets (top-k mass 0.5-0.99) and, for jsd, the teacher's final states and head."""

    ids_B_L: torch.Tensor
    mask_B_L: torch.Tensor
    prompt: int
    teacher_logps_B_T: torch.Tensor
    topk_ids_B_T_K: torch.Tensor
    topk_logps_B_T_K: torch.Tensor
    teacher_states_B_T_H: torch.Tensor
    teacher_head: torch.nn.Linear

    @property
    def width(self) -> int:
        return self.ids_B_L.shape[1] - self.prompt

    def completion_mask(self) -> torch.Tensor:
        return self.mask_B_L[:, self.prompt :].bool()

    def labels_B_L(self) -> torch.Tensor:
        """CE labels of a ROSE/SFT row: the completion's own ids, -100 on the prompt."""
        labels = self.ids_B_L.clone()
        labels[:, : self.prompt] = -100
        return labels


def make_batch(rows: int, prompt: int, width: int, vocab: int, teacher_hidden: int, k: int,
               device: torch.device, dtype: torch.dtype, seed: int = 0) -> Batch:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, prompt + width), generator=gen)
    mass = 0.5 + 0.49 * torch.rand(rows, width, 1, generator=gen)
    shares = torch.rand(rows, width, k, generator=gen).sort(dim=-1, descending=True).values
    topk_logps = (shares / shares.sum(-1, keepdim=True) * mass).log()
    # k distinct ids per position: one from each of k stripes of the vocabulary.
    stripe = vocab // k
    topk_ids = torch.randint(0, stripe, (rows * width, 1), generator=gen) + torch.arange(k) * stripe
    head = torch.nn.Linear(teacher_hidden, vocab, bias=False)
    torch.nn.init.normal_(head.weight, std=0.02, generator=gen)
    return Batch(
        ids.to(device),
        torch.ones_like(ids).to(device),
        prompt,
        (-3.0 * torch.rand(rows, width, generator=gen)).to(device),
        topk_ids.reshape(rows, width, k).to(device),
        topk_logps.to(device),
        torch.randn(rows, width, teacher_hidden, generator=gen).to(device=device, dtype=dtype),
        head.to(device=device, dtype=dtype).requires_grad_(False),
    )


# ------------------------------------------------------------------------------ scoring (teacher)


def score_distill(
    engine: Any, prompts: list[list[int]], completions: list[list[int]], k: int, whole: bool = True
) -> Step:
    """HFEngine.score: hidden states once, the head per chunk (top-k + token logprobs); all rows
    in one decoder pass (`whole`), or as many as the engine's SCORE_TOKENS per pass."""

    def step() -> dict[str, torch.Tensor]:
        scores = engine.score(prompts, completions, batch_size=len(prompts) if whole else None, top_k=k)
        return {"logp": scores.logprobs_B_T, "top_logp": scores.topk_logprobs_B_T_K}

    return step


def score_naive(model: Any, ids_B_L: torch.Tensor, prompt: int, k: int) -> Step:
    """model(...).logits of the completion positions -> fp32 log_softmax -> gather + top-k."""
    width = ids_B_L.shape[1] - prompt

    def step() -> dict[str, torch.Tensor]:
        with torch.no_grad():
            logits = model(input_ids=ids_B_L, use_cache=False, logits_to_keep=width + 1).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1)
            del logits
            token = logp.gather(-1, ids_B_L[:, prompt:, None])[..., 0]
            return {"logp": token, "top_logp": logp.topk(k, dim=-1).values}

    return step


# ------------------------------------------------------------------------------ student steps


def _naive_logp(model: Any, batch: Batch) -> torch.Tensor:
    """Full fp32 log_softmax of the completion positions [B, T, V] (the naive path's cost)."""
    logits = model(input_ids=batch.ids_B_L, attention_mask=batch.mask_B_L, use_cache=False,
                   logits_to_keep=batch.width + 1).logits[:, :-1]  # fmt: skip
    return torch.log_softmax(logits.float(), dim=-1)


def _distill_hidden(model: Any, batch: Batch) -> torch.Tensor:
    hidden_B_L_H = decoder_states(model, batch.ids_B_L, batch.mask_B_L)
    width = batch.width
    return hidden_B_L_H[:, -width - 1 : -1]


def _policy_loss(logp_B_T: torch.Tensor, batch: Batch) -> torch.Tensor:
    """token_reward_direct: A = logp_T - logp_S (detached), GRPO's importance-sampled loss at one
    iteration (ratio 1, no clip binds), mean over completion tokens."""
    mask = batch.completion_mask().float()
    adv = (batch.teacher_logps_B_T - logp_B_T.detach()) * mask
    ratio = torch.exp(logp_B_T - logp_B_T.detach())
    return -(ratio * adv * mask).sum() / mask.sum()


def _sampled_loss(loss: str, logp_N: torch.Tensor, batch: Batch) -> torch.Tensor:
    teacher_N = batch.teacher_logps_B_T[batch.completion_mask()]
    per_token = losses.direct_kl_per_token(loss, logp_N, teacher_N)
    return per_token.sum() / max(per_token.numel(), 1)


def _naive_jsd(ls: torch.Tensor, lt: torch.Tensor, beta: float) -> torch.Tensor:
    if beta == 0.0:
        return (lt.exp() * (lt - ls)).sum(-1).mean()
    if beta == 1.0:
        return (ls.exp() * (ls - lt)).sum(-1).mean()
    lm = torch.logsumexp(torch.stack([ls + math.log(1 - beta), lt + math.log(beta)]), dim=0)
    return (beta * (lt.exp() * (lt - lm)).sum(-1) + (1 - beta) * (ls.exp() * (ls - lm)).sum(-1)).mean()


def loss_distill(model: Any, batch: Batch, loss: str, beta: float) -> torch.Tensor:
    """The loss through distill's chunked head, as methods/signal.py computes it."""
    mask_B_T = batch.completion_mask()
    if loss == "token_reward_direct":
        logp_B_T, _, _ = completion_logprobs(model, model, batch.ids_B_L, batch.mask_B_L, batch.width)
        return _policy_loss(logp_B_T, batch)
    hidden_B_T_H = _distill_hidden(model, batch)
    hidden_N_H = select_positions(hidden_B_T_H, mask_B_T)
    weight, bias = output_head(model)
    sampled_N = batch.ids_B_L[:, batch.prompt :][mask_B_T]
    if loss == "jsd":
        head = model.get_output_embeddings()
        return losses.jsd_loss(
            hidden_B_T_H, batch.teacher_states_B_T_H, head, batch.teacher_head, mask_B_T, beta
        )
    if loss == "forward_kl_topk":
        teacher_ids = batch.topk_ids_B_T_K[mask_B_T]
        ids_N_K1 = torch.cat([sampled_N[:, None], teacher_ids], dim=1)
        gathered, lse_N, _, _ = head_gather_topk(hidden_N_H, weight, bias, ids_N_K1, teacher_ids.shape[-1])
        student_N_K = gathered[:, 1:] - lse_N[:, None]
        per_token = losses.topk_forward_kl_per_token(student_N_K, batch.topk_logps_B_T_K[mask_B_T])
        return per_token.sum() / max(per_token.numel(), 1)
    gathered, lse_N = head_gather(hidden_N_H, weight, bias, sampled_N[:, None])
    return _sampled_loss(loss, gathered[:, 0] - lse_N, batch)


def loss_naive(model: Any, batch: Batch, loss: str, beta: float) -> torch.Tensor:
    """The same loss from the full [B, T, V] fp32 log-probabilities."""
    logp_B_T_V = _naive_logp(model, batch)
    mask_B_T = batch.completion_mask()
    sampled = batch.ids_B_L[:, batch.prompt :]
    if loss == "jsd":
        teacher = batch.teacher_head(batch.teacher_states_B_T_H).float().log_softmax(-1)
        return _naive_jsd(logp_B_T_V[mask_B_T], teacher[mask_B_T], beta)
    if loss == "forward_kl_topk":
        student_N_K = logp_B_T_V.gather(-1, batch.topk_ids_B_T_K)[mask_B_T]
        per_token = losses.topk_forward_kl_per_token(student_N_K, batch.topk_logps_B_T_K[mask_B_T])
        return per_token.sum() / max(per_token.numel(), 1)
    logp_B_T = logp_B_T_V.gather(-1, sampled[..., None])[..., 0]
    if loss == "token_reward_direct":
        return _policy_loss(logp_B_T, batch)
    return _sampled_loss(loss, logp_B_T[mask_B_T], batch)


def loss_liger(model: Any, batch: Batch, loss: str, beta: float) -> torch.Tensor:
    """The loss through Liger-Kernel's fused linear kernels: cross-entropy (reduction none) for the
    sampled-token losses, its fused JSD for jsd; it has no top-k forward KL."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss, LigerFusedLinearJSD

    mask_B_T = batch.completion_mask()
    hidden_N_H = select_positions(_distill_hidden(model, batch), mask_B_T)
    weight, _ = output_head(model)
    if loss == "jsd":
        teacher_N_H = batch.teacher_states_B_T_H[mask_B_T]
        fused = LigerFusedLinearJSD(jsd_beta=beta)
        return fused(hidden_N_H, weight, teacher_N_H, batch.teacher_head.weight, None)
    if loss == "forward_kl_topk":
        raise NotImplementedError("Liger-Kernel has no top-k forward KL")
    sampled_N = batch.ids_B_L[:, batch.prompt :][mask_B_T]
    logp_N = -LigerFusedLinearCrossEntropyLoss(reduction="none")(weight, hidden_N_H, sampled_N)
    if loss == "token_reward_direct":
        logp_B_T = torch.zeros(mask_B_T.shape, dtype=logp_N.dtype, device=logp_N.device)
        logp_B_T = logp_B_T.masked_scatter(mask_B_T, logp_N)
        return _policy_loss(logp_B_T, batch)
    return _sampled_loss(loss, logp_N.float(), batch)


def ce_step(model: Any, batch: Batch, path: str) -> torch.Tensor:
    """ROSE / SFT: CE on the completion's tokens (kernels/states.ce_loss; naive: the model's own
    `labels=` loss over full logits; Liger: its fused linear cross-entropy)."""
    labels = batch.labels_B_L()
    if path == "naive":
        out = model(input_ids=batch.ids_B_L, attention_mask=batch.mask_B_L, labels=labels, use_cache=False)
        return out.loss
    if path == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        hidden_B_L_H = decoder_states(model, batch.ids_B_L, batch.mask_B_L)
        scored = labels[:, 1:] != -100
        hidden_N_H = select_positions(hidden_B_L_H[:, :-1], scored)
        weight, _ = output_head(model)
        return LigerFusedLinearCrossEntropyLoss()(weight, hidden_N_H, labels[:, 1:][scored])
    batch_dict = {"input_ids": batch.ids_B_L, "attention_mask": batch.mask_B_L, "labels": labels}
    return ce_loss(model, model, batch_dict)


def train_step(model: Any, compute: Callable[[], torch.Tensor]) -> Step:
    def step() -> dict[str, torch.Tensor]:
        loss = compute()
        loss.backward()
        return {"loss": loss.detach().float()}

    return step


# ------------------------------------------------------------------------------ variants


@contextmanager
def chunk_rows(rows: int | None) -> Iterator[None]:
    """Every chunked pass at `rows` rows per chunk (None: the device's default)."""
    if rows is None:
        yield
        return
    saved = heads.default_chunk_rows, jsd.default_chunk_rows
    fixed = lambda vocab, device=None: rows  # noqa: E731
    heads.default_chunk_rows = jsd.default_chunk_rows = fixed
    try:
        yield
    finally:
        heads.default_chunk_rows, jsd.default_chunk_rows = saved


_COMPILED: dict[str, Any] = {}


def _lse_pure(logits_C_V: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits_C_V, dim=-1)


def _dlogits_pure(logits_C_V: torch.Tensor, lse_C: torch.Tensor, grad_lse_C: torch.Tensor) -> torch.Tensor:
    return (logits_C_V - lse_C[:, None]).exp() * grad_lse_C[:, None].float()


@contextmanager
def compiled_blocks() -> Iterator[None]:
    """The chunk loop's block arithmetic (logsumexp forward; softmax-times-grad backward) as
    torch.compile'd kernels that read the block once or twice instead of 4-6 eager passes."""
    if not _COMPILED:
        _COMPILED["lse"] = torch.compile(_lse_pure, dynamic=True)
        _COMPILED["dlogits"] = torch.compile(_dlogits_pure, dynamic=True)
    saved_lse, saved_dlogits = heads._lse_inplace, heads._dlogits_block

    def lse(logits_C_V: torch.Tensor, entropy_C: torch.Tensor | None = None) -> torch.Tensor:
        if entropy_C is not None:
            return saved_lse(logits_C_V, entropy_C)
        return _COMPILED["lse"](logits_C_V)

    def dlogits(logits_C_V: torch.Tensor, lse_C: torch.Tensor, grad_lse_C: torch.Tensor | None,
                ids_C_K: torch.Tensor, grad_gathered_C_K: torch.Tensor | None, inv_temp: float) -> torch.Tensor:  # fmt: skip
        if grad_lse_C is None or inv_temp != 1.0:
            return saved_dlogits(logits_C_V, lse_C, grad_lse_C, ids_C_K, grad_gathered_C_K, inv_temp)
        out = _COMPILED["dlogits"](logits_C_V, lse_C, grad_lse_C)
        if grad_gathered_C_K is not None:
            out.scatter_add_(1, ids_C_K, grad_gathered_C_K.float())
        return out

    heads._lse_inplace, heads._dlogits_block = lse, dlogits
    try:
        yield
    finally:
        heads._lse_inplace, heads._dlogits_block = saved_lse, saved_dlogits


@contextmanager
def variant(rows: int | None, compiled: bool) -> Iterator[None]:
    with chunk_rows(rows):
        if compiled:
            with compiled_blocks():
                yield
        else:
            yield
