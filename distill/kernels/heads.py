"""Chunked output head: log-probabilities, logsumexp and top-k without a [tokens, vocab] tensor.

Why: at V = 151,936 and 4k-16k tokens one fp32 [N, V] logits tensor is 2.5-10 GB and autograd
through `log_softmax` keeps 2-3 of them, so every scoring/loss path uses this, not `.logits`.

Design
------
* Input: the decoder's final (normed) hidden states at the scored positions only, flattened to
  `hidden_N_H` (`select_positions`; padding costs nothing), and the head's `weight_V_H`/`bias_V`.
  Hidden states come from `model.model(...)`, or, where the call must go through a DDP/FSDP
  wrapper, `model(..., output_hidden_states=True, logits_to_keep=1).hidden_states[-1]`.
* Rows are processed `chunk` at a time in one reused [chunk, V] fp32 block, reduced in place to
  what the caller needs (logits at ids, row logsumexp, top-k): one block is the transient cost.
* A custom `torch.autograd.Function` saves only its inputs and lse_N and recomputes each block
  in backward (one extra matmul): d_logits = scatter(grad_gathered at ids) + grad_lse * softmax,
  accumulated chunk by chunk into fp32 buffers, cast to each input's dtype at the end. Tied
  embeddings need nothing special: autograd adds our weight gradient to the embedding's.
* Without grad (no_grad, or nothing requires grad) the Function is skipped entirely.

Numerics: logits = (hidden @ weight.T + bias) / temperature are never rounded to half precision.
On CUDA the matmul runs in the autocast dtype if on, else the promoted dtype of hidden and weight,
with an fp32 product (`out_dtype`); d_logits is cast to it for the two gradient matmuls, as
autograd would. Off CUDA half operands are upcast to fp32 (the weight once per call). Softmax,
logsumexp and gradient accumulation are fp32; gradients come back in each input's dtype. ids must
lie in [0, V). Under FSDP2 pass `weight.full_tensor()` (one all-gather per call, not per chunk).

Public API
----------
* `head_gather(hidden, weight, bias, ids_N_K)` -> (gathered_N_K, lse_N): fp32 logits at ids and
  row logsumexp, differentiable; logprob = gathered - lse[:, None].
* `head_gather_topk(..., ids_N_K, k)` -> (gathered_N_K, lse_N, top_ids_N_k, top_logprobs_N_k):
  the same plus the student's own top-k (no grad) from the same pass, for `topk_overlap`.
* `token_logprobs(hidden, weight, bias, targets_N)` -> logprobs_N (differentiable).
* `head_topk(hidden, weight, bias, k)` -> (ids_N_k, logprobs_N_k), no grad.
* `select_positions` / `scatter_positions`: [B, T, ...] <-> [N, ...] by a mask.
* `output_head(model)` -> (weight, bias) of an HF causal LM, refusing heads it cannot reproduce.
* `default_chunk_rows(V, device)`: rows per chunk for that device (below), the same for every
  call of a run on it: a caller logs it once.

Chunk size per device: on the CPU one fp32 [chunk, V] block is ~CHUNK_BYTES (128 MiB; time per
row is flat from 64 to 4096 rows there, so bigger blocks buy nothing). On a GPU small blocks
leave it idle between kernel launches: on an H200 at V = 151,936, 2,048-row blocks (1.16 GiB)
were 3-8% faster per training step than the CPU's 220 (../shared/tools/gpu/2026-12-04-h200.md),
so a GPU block is up to GPU_CHUNK_BYTES and never more than 1/64 of the device's memory, in a
power-of-two number of rows (whole matmul tiles). The loop itself makes no host sync on CUDA: no
`.item()`, `.tolist()`, boolean indexing or data-dependent shape (tests/kernels/test_heads.py).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from distill.kernels import compiled

# CPU: 220 rows at V=151,936, one chunk of 33k rows at V~1000, where chunking costs nothing.
CHUNK_BYTES = 128 * 2**20
# GPU: 2,048 rows at V=151,936 on an 80-141 GB device (the measured best), fewer on a small one.
GPU_CHUNK_BYTES = 1536 * 2**20
GPU_MEMORY_SHARE = 64


def gpu_chunk_rows(vocab: int, memory_bytes: int | None = None) -> int:
    """Rows per chunk on a GPU with `memory_bytes` of memory (None: no cap but GPU_CHUNK_BYTES):
    the largest power of two whose fp32 [rows, vocab] block fits the budget."""
    budget = (
        GPU_CHUNK_BYTES if memory_bytes is None else min(GPU_CHUNK_BYTES, memory_bytes // GPU_MEMORY_SHARE)
    )
    rows = max(1, budget // (4 * vocab))
    return 1 << (rows.bit_length() - 1)


@lru_cache(maxsize=16)
def _cuda_memory(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).total_memory)


def default_chunk_rows(vocab: int, device: torch.device | str | None = None) -> int:
    """Rows per chunk of the head's passes on `device` (None: the CPU). CPU and any non-CUDA
    device: one fp32 [rows, vocab] logits block is about `CHUNK_BYTES`; CUDA: `gpu_chunk_rows`
    for that device's memory."""
    where = torch.device(device) if device is not None else torch.device("cpu")
    if where.type != "cuda":
        return max(1, CHUNK_BYTES // (4 * vocab))
    index = where.index if where.index is not None else torch.cuda.current_device()
    return gpu_chunk_rows(vocab, _cuda_memory(index))


def _native_fp32_out(a: Tensor, b: Tensor) -> bool:
    # `torch.mm(..., out_dtype=torch.float32)` keeps a half product in fp32, on CUDA only.
    return a.is_cuda and a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)


def _mm_f32(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a @ b as fp32 (into `out` if given)."""
    if a.dtype == torch.float32 and b.dtype == torch.float32:
        return torch.mm(a, b, out=out)
    if _native_fp32_out(a, b):
        return torch.mm(a, b, out_dtype=torch.float32, out=out)
    product = torch.mm(a, b)
    return product.float() if out is None else out.copy_(product)


def _addmm_f32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b for an fp32 accumulator, without a weight-sized temporary."""
    if _native_fp32_out(a, b):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:  # fp32 operands (fp64 ones are rounded): in place, no temporary
        acc.addmm_(a.float(), b.float())


def chunk_logits(
    hidden_C_H: Tensor, weight_V_H: Tensor, bias_V: Tensor | None, inv_temp: float, buf_R_V: Tensor
) -> Tensor:
    """fp32 logits of one chunk of rows, written into the pass's reused block `buf_R_V`."""
    # Reuse matters on CPU: each fresh 100+ MB block is a fresh mmap whose first-touch page
    # faults cost as much as the matmul (measured: a pass ran ~2x slower without reuse).
    logits_C_V = _mm_f32(hidden_C_H.to(weight_V_H.dtype), weight_V_H.t(), out=buf_R_V[: hidden_C_H.shape[0]])
    if bias_V is not None:
        logits_C_V.add_(bias_V)
    if inv_temp != 1.0:
        logits_C_V.mul_(inv_temp)
    return logits_C_V


def _lse_inplace(logits_C_V: Tensor, entropy_C: Tensor | None = None) -> Tensor:
    """Row logsumexp, destroying the block (exp in place) so no second block is allocated; with
    `entropy_C`, also the row's entropy H = log S - sum(e log e) / S, e = exp(z - max), S = sum e."""
    max_C_1 = logits_C_V.amax(dim=-1, keepdim=True)
    # A row of -inf (fully masked) would give nan from -inf - -inf; its lse is -inf either way.
    max_C_1 = torch.where(torch.isfinite(max_C_1), max_C_1, torch.zeros_like(max_C_1))
    e_C_V = logits_C_V.sub_(max_C_1).exp_()
    sum_C = e_C_V.sum(dim=-1)
    if entropy_C is not None:
        entropy_C.copy_(sum_C.log() - torch.special.xlogy(e_C_V, e_C_V).sum(dim=-1) / sum_C)
    return sum_C.log_().add_(max_C_1.squeeze(-1))


def _matmul_dtype(hidden_N_H: Tensor, weight_V_H: Tensor) -> torch.dtype:
    """The caller's autocast dtype if on (as `F.linear` would use), else the promoted dtype; fp32
    for half dtypes off CUDA, where half matmuls measured 7-125x slower than fp32 (and round)."""
    # Decided once at the call and kept for backward, which runs outside the caller's autocast.
    device = hidden_N_H.device.type
    dtype = torch.promote_types(hidden_N_H.dtype, weight_V_H.dtype)
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) and device != "cuda" else dtype


def _forward_pass(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    ids_N_K: Tensor,
    inv_temp: float,
    chunk: int,
    topk: int,
    dtype: torch.dtype,
    entropy: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The chunk loop shared by every entry point; returns gathered, lse, top-k ids, top-k
    logprobs and (with `entropy`, else empty) the row entropy."""
    n_rows, n_ids = ids_N_K.shape
    device = hidden_N_H.device
    # The weight is copied only when its dtype is not the matmul dtype (autocast, half on CPU).
    weight_c_V_H, bias32_V = weight_V_H.to(dtype), None if bias_V is None else bias_V.float()
    gathered_N_K = torch.empty(n_rows, n_ids, dtype=torch.float32, device=device)
    lse_N = torch.empty(n_rows, dtype=torch.float32, device=device)
    top_ids_N_k = torch.empty(n_rows, topk, dtype=torch.long, device=device)
    top_lp_N_k = torch.empty(n_rows, topk, dtype=torch.float32, device=device)
    entropy_N = torch.empty(n_rows if entropy else 0, dtype=torch.float32, device=device)
    outs = gathered_N_K, lse_N, top_ids_N_k, top_lp_N_k, entropy_N
    fused = compiled.active(device)
    # Compiled: a bucket-sized block (kernels/compiled.py), zeroed so its padding rows are finite.
    buf_rows = compiled.bucket_rows(min(chunk, n_rows), chunk) if fused else min(chunk, n_rows)
    buf_R_V = (torch.zeros if fused else torch.empty)(
        buf_rows, weight_V_H.shape[0], dtype=torch.float32, device=device
    )
    with torch.autocast(device.type, enabled=False):  # autocast would round the logits to bf16
        for start in range(0, n_rows, chunk):
            rows = slice(start, start + chunk)
            logits_C_V = chunk_logits(hidden_N_H[rows], weight_c_V_H, bias32_V, inv_temp, buf_R_V)
            if fused:
                _fused_reduce(buf_R_V, logits_C_V.shape[0], ids_N_K, rows, chunk, topk, entropy, outs)
                continue
            # Gather and top-k read the logits before `_lse_inplace` overwrites them.
            gathered_N_K[rows] = logits_C_V.gather(1, ids_N_K[rows])
            if topk:
                top_val_C_k, top_ids_N_k[rows] = logits_C_V.topk(topk, dim=-1)
            lse_N[rows] = _lse_inplace(logits_C_V, entropy_N[rows] if entropy else None)
            if topk:
                top_lp_N_k[rows] = top_val_C_k - lse_N[rows, None]
    return outs


def _fused_reduce(
    buf_R_V: Tensor,
    n: int,
    ids_N_K: Tensor,
    rows: slice,
    chunk: int,
    topk: int,
    entropy: bool,
    outs: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
) -> None:
    """The compiled reduction of one chunk's `n` rows of logits into the pass's outputs."""
    gathered_N_K, lse_N, top_ids_N_k, top_lp_N_k, entropy_N = outs
    block_B_V = buf_R_V[: compiled.bucket_rows(n, chunk)]
    gathered, lse, top_lp, top_ids, ent = compiled.reduce_block(block_B_V, n, ids_N_K[rows], topk, entropy)
    gathered_N_K[rows], lse_N[rows] = gathered, lse
    if top_lp is not None and top_ids is not None:
        top_lp_N_k[rows], top_ids_N_k[rows] = top_lp, top_ids
    if ent is not None:
        entropy_N[rows] = ent


def _dlogits_block(
    logits_C_V: Tensor,
    lse_C: Tensor,
    grad_lse_C: Tensor | None,
    ids_C_K: Tensor,
    grad_gathered_C_K: Tensor | None,
    inv_temp: float,
) -> Tensor:
    """d loss / d raw logits of one chunk, built in the logits block itself (fp32, in place)."""
    if grad_lse_C is None:
        logits_C_V.zero_()
    else:  # d lse / d logits = softmax(logits)
        logits_C_V.sub_(lse_C[:, None]).exp_().mul_(grad_lse_C[:, None].float())
    if grad_gathered_C_K is not None:  # scatter_add: repeated ids must sum, not overwrite
        logits_C_V.scatter_add_(1, ids_C_K, grad_gathered_C_K.float())
    if inv_temp != 1.0:  # logits = raw / T, so d raw = d logits / T
        logits_C_V.mul_(inv_temp)
    return logits_C_V


def _backward_pass(
    ctx: Any, grad_gathered_N_K: Tensor | None, grad_lse_N: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Recompute each chunk's logits and turn them into d_logits in place; accumulate in fp32."""
    hidden_N_H, weight_V_H, bias_V, ids_N_K, lse_N = ctx.saved_tensors
    need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
    inv_temp, chunk, dtype = ctx.inv_temp, ctx.chunk, ctx.dtype
    weight_c_V_H, bias32_V = weight_V_H.to(dtype), None if bias_V is None else bias_V.float()
    device = hidden_N_H.device
    grad_hidden_N_H = (
        torch.zeros(hidden_N_H.shape, dtype=torch.float32, device=device) if need_hidden else None
    )
    grad_weight_V_H = (
        torch.zeros(weight_V_H.shape, dtype=torch.float32, device=device) if need_weight else None
    )
    grad_bias_V = torch.zeros(weight_V_H.shape[0], dtype=torch.float32, device=device) if need_bias else None
    buf_R_V = torch.empty(
        min(chunk, hidden_N_H.shape[0]), weight_V_H.shape[0], dtype=torch.float32, device=device
    )
    with torch.autocast(device.type, enabled=False):
        for start in range(0, hidden_N_H.shape[0], chunk):
            rows = slice(start, start + chunk)
            hidden_C_H = hidden_N_H[rows].to(dtype)
            dlogits_C_V = _dlogits_block(
                chunk_logits(hidden_C_H, weight_c_V_H, bias32_V, inv_temp, buf_R_V),
                lse_N[rows],
                None if grad_lse_N is None else grad_lse_N[rows],
                ids_N_K[rows],
                None if grad_gathered_N_K is None else grad_gathered_N_K[rows],
                inv_temp,
            )
            if grad_bias_V is not None:
                grad_bias_V.add_(dlogits_C_V.sum(dim=0))
            # CUDA half path: d_logits is multiplied in the matmul dtype, as autograd would.
            dlogits_C_V = dlogits_C_V.to(dtype)
            if grad_hidden_N_H is not None:
                _mm_f32(dlogits_C_V, weight_c_V_H, out=grad_hidden_N_H[rows])
            if grad_weight_V_H is not None:
                _addmm_f32(grad_weight_V_H, dlogits_C_V.t(), hidden_C_H)
    return (
        None if grad_hidden_N_H is None else grad_hidden_N_H.to(hidden_N_H.dtype),
        None if grad_weight_V_H is None else grad_weight_V_H.to(weight_V_H.dtype),
        None if grad_bias_V is None else grad_bias_V.to(bias_V.dtype),
    )


class _HeadGather(torch.autograd.Function):
    """Autograd wrapper over `_forward_pass`: saves inputs + lse_N, never a [N, V] tensor."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden_N_H: Tensor,
        weight_V_H: Tensor,
        bias_V: Tensor | None,
        ids_N_K: Tensor,
        inv_temp: float,
        chunk: int,
        topk: int,
        dtype: torch.dtype,
        entropy: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        outputs = _forward_pass(
            hidden_N_H, weight_V_H, bias_V, ids_N_K, inv_temp, chunk, topk, dtype, entropy
        )
        # Unused outputs get None gradients instead of materialized [N, K] zeros.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden_N_H, weight_V_H, bias_V, ids_N_K, outputs[1])
        ctx.inv_temp, ctx.chunk, ctx.dtype = inv_temp, chunk, dtype
        # The top-k and the entropy are read, never differentiated (the entropy is a metric here).
        ctx.mark_non_differentiable(outputs[2], outputs[3], outputs[4])
        return outputs

    @staticmethod
    def backward(
        ctx: Any, grad_gathered_N_K: Tensor | None, grad_lse_N: Tensor | None, *_: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        grads = _backward_pass(ctx, grad_gathered_N_K, grad_lse_N)
        return (*grads, None, None, None, None, None, None)


def _run(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    ids_N_K: Tensor,
    temperature: float,
    chunk_size: int | None,
    topk: int,
    entropy: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Validate, pick the chunk, and skip autograd entirely when no gradient can flow."""
    if hidden_N_H.dim() != 2 or ids_N_K.dim() != 2 or ids_N_K.shape[0] != hidden_N_H.shape[0]:
        raise ValueError(f"want hidden [N, H], ids [N, K]; got {hidden_N_H.shape}, {ids_N_K.shape}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    chunk = (
        chunk_size if chunk_size is not None else default_chunk_rows(weight_V_H.shape[0], hidden_N_H.device)
    )
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk}")
    ids_N_K = ids_N_K.long()
    inv_temp = 1.0 / temperature
    dtype = _matmul_dtype(hidden_N_H, weight_V_H)
    params = (hidden_N_H, weight_V_H) if bias_V is None else (hidden_N_H, weight_V_H, bias_V)
    if torch.is_grad_enabled() and any(p.requires_grad for p in params):
        out: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] = _HeadGather.apply(
            hidden_N_H, weight_V_H, bias_V, ids_N_K, inv_temp, chunk, topk, dtype, entropy
        )
        return out
    with torch.no_grad():
        return _forward_pass(hidden_N_H, weight_V_H, bias_V, ids_N_K, inv_temp, chunk, topk, dtype, entropy)


def head_gather(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    ids_N_K: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Logits (hidden @ weight.T + bias) / temperature at `ids_N_K` and the row logsumexp, fp32 and
    differentiable; logprobs are `gathered_N_K - lse_N[:, None]`. `chunk_size`: rows per block."""
    gathered_N_K, lse_N, _, _, _ = _run(hidden_N_H, weight_V_H, bias_V, ids_N_K, temperature, chunk_size, 0)
    return gathered_N_K, lse_N


def head_gather_topk(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    ids_N_K: Tensor,
    k: int,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`head_gather` plus this head's own top-`k` ids and logprobs (no grad) from the same pass,
    for metrics such as `topk_overlap` that would otherwise cost a second pass over the vocabulary."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _run(hidden_N_H, weight_V_H, bias_V, ids_N_K, temperature, chunk_size, k)[:4]


def token_logprobs(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    targets_N: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """Differentiable fp32 log-probability of `targets_N` under the (tempered) head."""
    gathered_N_1, lse_N = head_gather(
        hidden_N_H, weight_V_H, bias_V, targets_N[:, None], temperature=temperature, chunk_size=chunk_size
    )
    return gathered_N_1[:, 0] - lse_N


def token_logprobs_entropy(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    targets_N: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """`token_logprobs` (differentiable) and each row's entropy (fp32, no grad) from one pass."""
    gathered_N_1, lse_N, _, _, entropy_N = _run(
        hidden_N_H, weight_V_H, bias_V, targets_N[:, None], temperature, chunk_size, 0, entropy=True
    )
    return gathered_N_1[:, 0] - lse_N, entropy_N


@torch.no_grad()
def head_topk(
    hidden_N_H: Tensor,
    weight_V_H: Tensor,
    bias_V: Tensor | None,
    k: int,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Top-`k` token ids (int64) and fp32 log-probabilities per row, without grad."""
    no_ids_N_0 = torch.empty(hidden_N_H.shape[0], 0, dtype=torch.long, device=hidden_N_H.device)
    _, _, ids_N_k, logprobs_N_k = head_gather_topk(
        hidden_N_H, weight_V_H, bias_V, no_ids_N_0, k, temperature=temperature, chunk_size=chunk_size
    )
    return ids_N_k, logprobs_N_k


def select_positions(values_B_T_X: Tensor, mask_B_T: Tensor) -> Tensor:
    """[N, ...] rows where the mask is set (row-major, differentiable). Shift first: hidden at t
    scores token t+1, e.g. `select_positions(hidden_B_T_H[:, :-1], completion_mask_B_T[:, 1:])`."""
    return values_B_T_X[mask_B_T.bool()]


def scatter_positions(values_N_X: Tensor, mask_B_T: Tensor, fill: float = 0.0) -> Tensor:
    """Inverse of `select_positions`: a [B, T, ...] tensor with `fill` where the mask is unset."""
    mask = mask_B_T.bool()
    out_B_T_X = values_N_X.new_full((*mask.shape, *values_N_X.shape[1:]), fill)
    out_B_T_X[mask] = values_N_X
    return out_B_T_X


def head_module(model: torch.nn.Module) -> torch.nn.Linear:
    """An HF causal LM's output head module; refuses a head that is not an nn.Linear (e.g. PEFT-wrapped)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"output head must be an nn.Linear, got {type(head).__name__}")
    return head


def head_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(vocabulary rows, hidden size) of an HF causal LM's output head, as the module declares them:
    a sharded weight (ZeRO-3 partitions it to 0 rows on every rank) never says its full shape."""
    head = head_module(model)
    return int(head.out_features), int(head.in_features)


def output_head(model: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """(weight_V_H, bias_V or None) of an HF causal LM's output head, as live parameters. Raises for
    heads whose logits are not `hidden @ W.T + b`: Gemma soft-capping, Cohere/Granite logit scaling,
    non-Linear (e.g. PEFT-wrapped) heads."""
    head = head_module(model)
    config = getattr(model, "config", None)
    for attr, neutral in (("final_logit_softcapping", None), ("logit_scale", 1.0), ("logits_scaling", 1.0)):
        value = getattr(config, attr, neutral)
        if value is not None and value != neutral:
            raise NotImplementedError(f"{attr}={value} is not supported by the chunked head")
    return head.weight, head.bias
