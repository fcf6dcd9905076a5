"""Full-vocabulary generalised JSD between two heads, chunked: never a [N, V] tensor.

TRL's convention: beta 0 is forward KL(teacher || student), 1 reverse KL(student || teacher), in
between the JSD with the mixture m = beta * teacher + (1 - beta) * student. Each chunk of rows
runs through both heads in reused fp32 blocks (heads.py's `chunk_logits`), and the student's chunk
is recomputed in backward, so four [chunk, V] blocks are the live memory at any length. Only the
student's hidden states and head get gradients (the teacher is a fixed target).

The gradient w.r.t. the student's logits z is p * (g - sum(p * g)), p = softmax(z), with
g = -q / p (beta 0), log p - log q (beta 1), (1 - beta) * log(p / m) in between.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from distill.kernels import compiled
from distill.kernels.heads import chunk_logits, default_chunk_rows


def _log_softmax_block(
    hidden_C_H: Tensor, weight: Tensor, bias: Tensor | None, inv_temp: float, buf: Tensor, work: Tensor
) -> Tensor:
    """Log-softmax of one chunk's logits, in the reused block `buf` (`work`: an exp scratch block)."""
    block = chunk_logits(hidden_C_H, weight, bias, inv_temp, buf)
    block.sub_(block.amax(dim=-1, keepdim=True))
    total_C = torch.exp(block, out=work[: block.shape[0]]).sum(dim=-1)
    return block.sub_(total_C.log_()[:, None])


def _jsd_block(ls: Tensor, lt: Tensor, beta: float, work: Tensor, scratch: Tensor) -> tuple[Tensor, Tensor]:
    """(per-row loss, g) of one chunk from the student's and teacher's log-softmax blocks, where
    d loss / d student logits = p * (g - sum(p * g)); `work` and `scratch` are reused blocks."""
    p_s = torch.exp(ls, out=scratch[: ls.shape[0]])
    if beta == 0.0:  # KL(q || p): gradient p - q, i.e. g = -q / p
        q = torch.exp(lt, out=work[: ls.shape[0]])
        loss_C = (q * (lt - ls)).sum(-1)
        return loss_C, q.div_(p_s).neg_()
    if beta == 1.0:  # KL(p || q): g = log p - log q
        g = torch.sub(ls, lt, out=work[: ls.shape[0]])
        return (p_s * g).sum(-1), g
    # m = beta * q + (1 - beta) * p; loss = beta KL(q || m) + (1 - beta) KL(p || m); g = (1 - beta) log(p / m)
    lm = torch.logaddexp(ls + math.log(1 - beta), lt + math.log(beta), out=work[: ls.shape[0]])
    loss_C = beta * (lt.exp() * (lt - lm)).sum(-1) + (1 - beta) * (p_s * (ls - lm)).sum(-1)
    return loss_C, torch.sub(ls, lm, out=lm).mul_(1 - beta)


def _fp32(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.float()


def _block_logprobs(
    hs: Tensor,
    ht: Tensor,
    heads: tuple[Tensor | None, ...],
    rows: slice,
    inv_temp: float,
    blocks: list[Tensor],
) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk's fp32 student hidden states and both sides' log-softmax blocks. `heads`: the
    fp32 (weight, bias) of student then teacher, converted once per pass, not once per chunk."""
    ws, bs, wt, bt = heads
    assert ws is not None and wt is not None
    h_C_H = hs[rows].float()
    ls = _log_softmax_block(h_C_H, ws, bs, inv_temp, blocks[0], blocks[2])
    lt = _log_softmax_block(ht[rows].float(), wt, bt, inv_temp, blocks[1], blocks[2])
    return h_C_H, ls, lt


def _blocks(hs: Tensor, vocab: int, chunk: int, fused: bool) -> list[Tensor]:
    """The pass's reused fp32 blocks: four of a chunk's rows eager; compiled, two of its bucket's
    rows (kernels/compiled.py), zeroed so their padding rows are finite."""
    rows = min(chunk, hs.shape[0])
    if fused:
        bucket = compiled.bucket_rows(rows, chunk)
        return [torch.zeros(bucket, vocab, dtype=torch.float32, device=hs.device) for _ in range(2)]
    return [torch.empty(rows, vocab, dtype=torch.float32, device=hs.device) for _ in range(4)]


def _bucket_logits(
    h_C_H: Tensor,
    ht_C_H: Tensor,
    heads: tuple[Tensor | None, ...],
    inv_temp: float,
    blocks: list[Tensor],
    chunk: int,
) -> tuple[Tensor, Tensor, int]:
    """One chunk's two heads' logits written into the bucket-sized blocks, for the compiled
    reductions: the student's and the teacher's bucket views and the chunk's row count."""
    ws, bs, wt, bt = heads
    assert ws is not None and wt is not None
    chunk_logits(h_C_H, ws, bs, inv_temp, blocks[0])
    chunk_logits(ht_C_H, wt, bt, inv_temp, blocks[1])
    n = h_C_H.shape[0]
    bucket = compiled.bucket_rows(n, chunk)
    return blocks[0][:bucket], blocks[1][:bucket], n


class _ChunkedJSD(torch.autograd.Function):
    """Sum over rows of the generalised JSD, both heads per chunk in reused blocks; the student's
    chunk is recomputed in backward. Only the student's hidden states and head get gradients."""

    @staticmethod
    def forward(
        ctx: Any,
        hs: Tensor,
        ws: Tensor,
        bs: Tensor | None,
        ht: Tensor,
        wt: Tensor,
        bt: Tensor | None,
        beta: float,
        inv_temp: float,
        chunk: int,
    ) -> Tensor:
        fused = compiled.active(hs.device)
        blocks = _blocks(hs, ws.shape[0], chunk, fused)
        total = torch.zeros((), dtype=torch.float32, device=hs.device)
        heads = _fp32(ws), _fp32(bs), _fp32(wt), _fp32(bt)
        with torch.no_grad(), torch.autocast(hs.device.type, enabled=False):
            for start in range(0, hs.shape[0], chunk):
                rows_slice = slice(start, start + chunk)
                if fused:
                    s_B_V, t_B_V, n = _bucket_logits(
                        hs[rows_slice].float(), ht[rows_slice].float(), heads, inv_temp, blocks, chunk
                    )
                    total += compiled.jsd_rows(s_B_V, t_B_V, n, beta).sum()
                    continue
                _, ls, lt = _block_logprobs(hs, ht, heads, rows_slice, inv_temp, blocks)
                total += _jsd_block(ls, lt, beta, blocks[2], blocks[3])[0].sum()
        ctx.save_for_backward(hs, ws, bs, ht, wt, bt)
        ctx.beta, ctx.inv_temp, ctx.chunk = beta, inv_temp, chunk
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: Tensor) -> tuple[Tensor | None, ...]:
        hs, ws, bs, ht, wt, bt = ctx.saved_tensors
        chunk, inv_temp = ctx.chunk, ctx.inv_temp
        fused = compiled.active(hs.device)
        blocks = _blocks(hs, ws.shape[0], chunk, fused)
        grad_hs = torch.zeros(hs.shape, dtype=torch.float32, device=hs.device)
        grad_ws = torch.zeros(ws.shape, dtype=torch.float32, device=hs.device)
        grad_bs = None if bs is None else torch.zeros(ws.shape[0], dtype=torch.float32, device=hs.device)
        ws32 = ws.float()
        heads = ws32, _fp32(bs), _fp32(wt), _fp32(bt)
        scale = (grad_total * inv_temp).float()
        with torch.no_grad(), torch.autocast(hs.device.type, enabled=False):
            for start in range(0, hs.shape[0], chunk):
                rows = slice(start, start + chunk)
                if fused:
                    h_C_H = hs[rows].float()
                    s_B_V, t_B_V, n = _bucket_logits(h_C_H, ht[rows].float(), heads, inv_temp, blocks, chunk)
                    dz = compiled.jsd_grad(s_B_V, t_B_V, n, ctx.beta, scale)
                else:
                    h_C_H, ls, lt = _block_logprobs(hs, ht, heads, rows, inv_temp, blocks)
                    _, g = _jsd_block(ls, lt, ctx.beta, blocks[2], blocks[3])
                    p_s = ls.exp_()  # the student block is not needed as log-probabilities any more
                    dz = g.sub_((p_s * g).sum(-1, keepdim=True)).mul_(p_s).mul_(scale)
                grad_hs[rows] = dz @ ws32
                grad_ws.addmm_(dz.t(), h_C_H)
                if grad_bs is not None:
                    grad_bs.add_(dz.sum(0))
        return (
            grad_hs.to(hs.dtype),
            grad_ws.to(ws.dtype) if ctx.needs_input_grad[1] else None,
            None if grad_bs is None or bs is None else grad_bs.to(bs.dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def chunked_jsd(
    student_N_H: Tensor,
    teacher_N_H: Tensor,
    student_head: tuple[Tensor, Tensor | None],
    teacher_head: tuple[Tensor, Tensor | None],
    beta: float,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """Mean generalised JSD over rows (TRL's convention: beta 0 forward KL, 1 reverse KL, in
    between JSD with the mixture beta * teacher + (1 - beta) * student), both heads applied per
    chunk of rows in reused blocks and the student's chunk recomputed in backward: the live
    memory is four [chunk, V] blocks, never [N, V]. The teacher side gets no gradient."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    elsewhere = {str(t.device) for t in (teacher_N_H, *student_head, *teacher_head) if t is not None}
    elsewhere -= {str(student_N_H.device)}
    if elsewhere:  # a matmul across devices would fail deep in the chunk loop
        raise ValueError(
            f"chunked_jsd: the student's hidden states are on {student_N_H.device} but a head or the "
            f"teacher's hidden states on {', '.join(sorted(elsewhere))}: every operand on one device"
        )
    n_rows = student_N_H.shape[0]
    if n_rows == 0:
        return student_N_H.sum() * 0.0
    # Four blocks live at once (two log-softmaxes, two scratch), each a quarter of CHUNK_BYTES.
    chunk = chunk_size or max(1, default_chunk_rows(student_head[0].shape[0], student_N_H.device) // 4)
    (ws, bs), (wt, bt) = student_head, teacher_head
    total: Tensor = _ChunkedJSD.apply(
        student_N_H,
        ws,
        bs,
        teacher_N_H.detach(),
        wt.detach(),
        None if bt is None else bt.detach(),
        beta,
        1.0 / temperature,
        chunk,
    )
    return total / n_rows
