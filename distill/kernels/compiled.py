"""`torch.compile` for the chunk loops' reductions: one fused pass per [chunk, V] block.

Why: after the head's matmul, the eager loop reads and writes the fp32 logits block several
times (max, subtract, exp in place, sum; the two log-softmaxes and the divergence of jsd). A
compiled reduction reads it twice and writes nothing of its size: the block stays the one
transient, and the time of the non-matmul part falls. The matmul itself stays eager, into the
loop's reused block (on the CPU a fresh block per chunk costs page faults as large as the
matmul, and inductor would allocate one).

What is compiled: `reduce_block` (gather at ids, logsumexp, optional top-k and entropy) for
heads.py's forward pass; `jsd_rows` (both log-softmaxes and the row divergence) for jsd.py's
forward and `jsd_grad` (d loss / d student logits from the two blocks) for its backward. The head's
backward stays eager: its block is rewritten in place, which inductor does not do without an extra
block (measured: compiled 1.8-2.0x slower than the eager in-place backward).

Shapes: the rows of a block are rounded up to a power of two (`bucket_rows`, at least
MIN_BUCKET) and the block padded, so a run compiles each reduction once per (bucket, vocabulary,
ids per row, top-k, entropy) and never again, whatever its steps' token counts; `compiled_graphs()`
counts them (logged by the run once per step as `perf/compiled_graphs`). Results equal the
eager path's within float reduction order (fp32: logsumexp within 2e-7 relative, jsd's gradients
within 2e-6 of their largest entry; tests/kernels/test_compiled.py); gathered logits and top-k ids
are exact.

The switch: `set_mode("auto" | "on" | "off")` (config `kernels.compile`). `auto` compiles on
CUDA and not on the CPU: there the compiled loss phase is 0.7x at Qwen's vocabulary, but each
process compiles for tens of seconds and the embedded default's steps gained nothing
(docs/speed.md).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, Literal, cast

import torch
from torch import Tensor

Mode = Literal["auto", "on", "off"]
MODES: tuple[str, ...] = ("auto", "on", "off")
# Small blocks are padded to this many rows: fewer shapes to compile, a negligible pad.
MIN_BUCKET = 64
# Dynamo's default of 8 graphs per function would fall back to eager after 8 shape buckets.
RECOMPILE_LIMIT = 64

_mode: Mode = "auto"
# A thread's own setting wins over the process's: benchmarks/opd_step.py runs a compiled and an
# eager run side by side, one per thread, in one process.
_local = threading.local()
_seen: set[tuple[Any, ...]] = set()
_compiled: dict[str, Callable[..., Any]] = {}


def set_mode(mode: str) -> None:
    """`on`, `off`, or `auto` (on CUDA only), for this process and, first, this thread."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"kernels.compile must be one of {', '.join(MODES)}, got {mode!r}")
    _mode = _local.mode = cast(Mode, mode)


def mode() -> Mode:
    return cast(Mode, getattr(_local, "mode", _mode))


def active(device: torch.device) -> bool:
    """Whether the chunk reductions on `device` run compiled."""
    current = mode()
    return current == "on" or (current == "auto" and device.type == "cuda")


def compiled_graphs() -> int:
    """Distinct compiled shapes so far in this process (a run logs it: it stops growing after warm-up)."""
    return len(_seen)


def bucket_rows(rows: int, limit: int) -> int:
    """`rows` rounded up to a power of two (at least MIN_BUCKET), never above `limit`."""
    return min(limit, max(MIN_BUCKET, 1 << max(0, rows - 1).bit_length()))


def _get(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    import torch._dynamo

    # Dynamo's settings are per thread: raised in the thread that calls, every time (a trainer's
    # loss and a benchmark's systems run in threads of their own).
    config = torch._dynamo.config
    if config.recompile_limit < RECOMPILE_LIMIT:
        config.recompile_limit = RECOMPILE_LIMIT
    if name not in _compiled:
        _compiled[name] = torch.compile(fn, dynamic=False)
    return _compiled[name]


def _note(*key: Any) -> None:
    _seen.add(key)


def pad_rows(values_C_X: Tensor, rows: int) -> Tensor:
    """`values_C_X` with zero rows appended up to `rows`."""
    if values_C_X.shape[0] == rows:
        return values_C_X
    pad = values_C_X.new_zeros((rows - values_C_X.shape[0], *values_C_X.shape[1:]))
    return torch.cat([values_C_X, pad])


def _reduce(
    logits_C_V: Tensor, ids_C_K: Tensor, topk: int, entropy: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    gathered_C_K = logits_C_V.gather(1, ids_C_K)
    max_C_1 = logits_C_V.amax(dim=-1, keepdim=True)
    # A row of -inf (fully masked): its lse is -inf, never nan from -inf - -inf.
    max_C_1 = torch.where(torch.isfinite(max_C_1), max_C_1, torch.zeros_like(max_C_1))
    e_C_V = (logits_C_V - max_C_1).exp()
    sum_C = e_C_V.sum(dim=-1)
    lse_C = sum_C.log() + max_C_1[:, 0]
    top_lp = top_ids = ent_C = None
    if topk:
        top_val_C_k, top_ids = logits_C_V.topk(topk, dim=-1)
        top_lp = top_val_C_k - lse_C[:, None]
    if entropy:
        ent_C = sum_C.log() - torch.special.xlogy(e_C_V, e_C_V).sum(dim=-1) / sum_C
    return gathered_C_K, lse_C, top_lp, top_ids, ent_C


def reduce_block(
    block_B_V: Tensor, rows: int, ids_C_K: Tensor, topk: int, entropy: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Compiled: of the first `rows` rows of the bucket-sized logits block `block_B_V` (rows
    past them are padding, read and dropped), the logits at `ids_C_K`, the row logsumexp, the
    top-`topk` logprobs and ids, and the row entropy; the block is left as it was."""
    bucket = block_B_V.shape[0]
    _note("reduce", bucket, block_B_V.shape[1], ids_C_K.shape[1], topk, entropy, block_B_V.device)
    out = _get("reduce", _reduce)(block_B_V, pad_rows(ids_C_K, bucket), topk, entropy)
    return tuple(None if t is None else t[:rows] for t in out)  # type: ignore[return-value]


def _log_softmax(logits_C_V: Tensor) -> Tensor:
    max_C_1 = logits_C_V.amax(dim=-1, keepdim=True)
    shifted_C_V = logits_C_V - max_C_1
    return shifted_C_V - shifted_C_V.exp().sum(dim=-1, keepdim=True).log()


def _jsd(student_C_V: Tensor, teacher_C_V: Tensor, beta: float) -> Tensor:
    ls, lt = _log_softmax(student_C_V), _log_softmax(teacher_C_V)
    if beta == 0.0:
        return (lt.exp() * (lt - ls)).sum(-1)
    if beta == 1.0:
        return (ls.exp() * (ls - lt)).sum(-1)
    lm = torch.logaddexp(ls + math.log(1 - beta), lt + math.log(beta))
    return beta * (lt.exp() * (lt - lm)).sum(-1) + (1 - beta) * (ls.exp() * (ls - lm)).sum(-1)


def jsd_rows(student_B_V: Tensor, teacher_B_V: Tensor, rows: int, beta: float) -> Tensor:
    """Compiled: the generalised JSD of each of the first `rows` rows of two bucket-sized logits
    blocks (jsd.py's convention for `beta`); neither block is changed."""
    _note("jsd", student_B_V.shape[0], student_B_V.shape[1], beta, student_B_V.device)
    return _get("jsd", _jsd)(student_B_V, teacher_B_V, beta)[:rows]


def _jsd_grad(student_C_V: Tensor, teacher_C_V: Tensor, beta: float, scale: Tensor) -> Tensor:
    # As jsd.py's eager backward: d loss / d student logits = p * (g - sum(p * g)) * scale.
    ls, lt = _log_softmax(student_C_V), _log_softmax(teacher_C_V)
    p_s = ls.exp()
    if beta == 0.0:
        g = -(lt.exp() / p_s)
    elif beta == 1.0:
        g = ls - lt
    else:
        g = (ls - torch.logaddexp(ls + math.log(1 - beta), lt + math.log(beta))) * (1 - beta)
    return (g - (p_s * g).sum(-1, keepdim=True)) * p_s * scale


def jsd_grad(student_B_V: Tensor, teacher_B_V: Tensor, rows: int, beta: float, scale: Tensor) -> Tensor:
    """Compiled: d (scale * sum of the rows' JSD) / d student logits, for the first `rows` rows
    of two bucket-sized logits blocks; `scale` a 0-d tensor (a float would compile per value)."""
    _note("jsd_grad", student_B_V.shape[0], student_B_V.shape[1], beta, student_B_V.device)
    return _get("jsd_grad", _jsd_grad)(student_B_V, teacher_B_V, beta, scale)[:rows]
