"""Chunked output head: agreement with the unchunked log_softmax in value and gradient, and memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from distill.kernels.heads import (
    default_chunk_rows,
    gpu_chunk_rows,
    head_gather,
    head_gather_topk,
    head_topk,
    output_head,
    scatter_positions,
    select_positions,
    token_logprobs,
)

N, H, V, K = 50, 16, 97, 5
# 50 rows: 7 and 16 do not divide N, 1 is the extreme, 64 and None give one chunk.
CHUNKS = [1, 7, 16, 64, None]
TOL = {"rtol": 1e-5, "atol": 1e-5}


def make(
    dtype: torch.dtype = torch.float32, bias: bool = True, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Leaf hidden/weight/bias with logits of order 1-3 (so 1e-5 is a meaningful tolerance)."""
    gen = torch.Generator().manual_seed(seed)
    hidden_N_H = torch.randn(N, H, generator=gen).to(dtype).requires_grad_()
    weight_V_H = (torch.randn(V, H, generator=gen) * 0.4).to(dtype).requires_grad_()
    bias_V = (torch.randn(V, generator=gen) * 0.5).to(dtype).requires_grad_() if bias else None
    ids_N_K = torch.randint(0, V, (N, K), generator=gen)
    ids_N_K[:, 1] = ids_N_K[:, 0]  # repeated ids: their gradients must add up
    return hidden_N_H, weight_V_H, bias_V, ids_N_K


def reference_logits(
    hidden_N_H: Tensor, weight_V_H: Tensor, bias_V: Tensor | None, temperature: float
) -> Tensor:
    logits_N_V = hidden_N_H @ weight_V_H.T
    if bias_V is not None:
        logits_N_V = logits_N_V + bias_V
    return logits_N_V.float() / temperature


def grads_of(loss: Tensor, *params: Tensor | None) -> list[Tensor]:
    present = [p for p in params if p is not None]
    return list(torch.autograd.grad(loss, present))


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
def test_gather_matches_unchunked_in_value_and_gradient(
    chunk_size: int | None, temperature: float, bias: bool
) -> None:
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make(bias=bias)
    gen = torch.Generator().manual_seed(1)
    up_N_K, up_N = torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)

    gathered_N_K, lse_N = head_gather(
        hidden_N_H, weight_V_H, bias_V, ids_N_K, temperature=temperature, chunk_size=chunk_size
    )
    logits_N_V = reference_logits(hidden_N_H, weight_V_H, bias_V, temperature)
    ref_gathered_N_K, ref_lse_N = logits_N_V.gather(1, ids_N_K), logits_N_V.logsumexp(-1)
    torch.testing.assert_close(gathered_N_K, ref_gathered_N_K, **TOL)
    torch.testing.assert_close(lse_N, ref_lse_N, **TOL)
    ref_logprobs_N_K = torch.log_softmax(logits_N_V, -1).gather(1, ids_N_K)
    torch.testing.assert_close(gathered_N_K - lse_N[:, None], ref_logprobs_N_K, **TOL)

    # Independent upstream gradients on both outputs exercise both terms of d_logits.
    ours = grads_of((gathered_N_K * up_N_K).sum() + (lse_N * up_N).sum(), hidden_N_H, weight_V_H, bias_V)
    ref = grads_of(
        (ref_gathered_N_K * up_N_K).sum() + (ref_lse_N * up_N).sum(), hidden_N_H, weight_V_H, bias_V
    )
    for got, want in zip(ours, ref, strict=True):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("used", ["gathered", "lse"])
def test_gradient_when_only_one_output_is_used(used: str) -> None:
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make()
    gathered_N_K, lse_N = head_gather(hidden_N_H, weight_V_H, bias_V, ids_N_K, chunk_size=7)
    logits_N_V = reference_logits(hidden_N_H, weight_V_H, bias_V, 1.0)
    if used == "gathered":
        loss, ref_loss = gathered_N_K.square().sum(), logits_N_V.gather(1, ids_N_K).square().sum()
    else:
        loss, ref_loss = lse_N.square().sum(), logits_N_V.logsumexp(-1).square().sum()
    for got, want in zip(
        grads_of(loss, hidden_N_H, weight_V_H, bias_V),
        grads_of(ref_loss, hidden_N_H, weight_V_H, bias_V),
        strict=True,
    ):
        torch.testing.assert_close(got, want, **TOL)


def test_token_logprobs_and_frozen_head() -> None:
    hidden_N_H, weight_V_H, _, ids_N_K = make(bias=False)
    weight_V_H.requires_grad_(False)  # a frozen head (LoRA): no weight-sized gradient is built
    logprobs_N = token_logprobs(hidden_N_H, weight_V_H, None, ids_N_K[:, 0], temperature=1.3, chunk_size=16)
    ref_N = torch.log_softmax(reference_logits(hidden_N_H, weight_V_H, None, 1.3), -1).gather(
        1, ids_N_K[:, :1]
    )[:, 0]
    torch.testing.assert_close(logprobs_N, ref_N, **TOL)
    (grad,) = grads_of(logprobs_N.sum(), hidden_N_H)
    (ref_grad,) = grads_of(ref_N.sum(), hidden_N_H)
    torch.testing.assert_close(grad, ref_grad, **TOL)


def test_no_grad_paths_skip_autograd() -> None:
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make()
    with torch.no_grad():
        gathered_N_K, lse_N = head_gather(hidden_N_H, weight_V_H, bias_V, ids_N_K, chunk_size=7)
    assert gathered_N_K.grad_fn is None and lse_N.grad_fn is None
    detached = [t.detach() for t in (hidden_N_H, weight_V_H)]
    logprobs_N = token_logprobs(*detached, None, ids_N_K[:, 0])
    assert logprobs_N.grad_fn is None and not logprobs_N.requires_grad
    torch.testing.assert_close(
        lse_N, reference_logits(hidden_N_H, weight_V_H, bias_V, 1.0).logsumexp(-1), **TOL
    )


@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_topk_matches_unchunked(chunk_size: int | None) -> None:
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make()
    ids_N_k, logprobs_N_k = head_topk(
        hidden_N_H, weight_V_H, bias_V, 8, temperature=0.8, chunk_size=chunk_size
    )
    ref = torch.log_softmax(reference_logits(hidden_N_H, weight_V_H, bias_V, 0.8), -1).topk(8, dim=-1)
    assert torch.equal(ids_N_k, ref.indices)
    torch.testing.assert_close(logprobs_N_k, ref.values.detach(), **TOL)
    assert not logprobs_N_k.requires_grad

    # The same pass as head_gather: identical gathered/lse, the same top-k, and still differentiable.
    gathered_N_K, lse_N, top_ids_N_k, top_lp_N_k = head_gather_topk(
        hidden_N_H, weight_V_H, bias_V, ids_N_K, 8, temperature=0.8, chunk_size=chunk_size
    )
    plain_N_K, plain_lse_N = head_gather(
        hidden_N_H, weight_V_H, bias_V, ids_N_K, temperature=0.8, chunk_size=chunk_size
    )
    assert torch.equal(top_ids_N_k, ids_N_k) and torch.equal(top_lp_N_k, logprobs_N_k)
    assert torch.equal(gathered_N_K, plain_N_K) and torch.equal(lse_N, plain_lse_N)
    assert lse_N.requires_grad and not top_lp_N_k.requires_grad


@pytest.mark.parametrize("bias", [True, False])
def test_bf16_on_cpu_is_the_fp32_product_of_the_bf16_values(bias: bool) -> None:
    """Off CUDA, half operands are upcast: logits are exact fp32 products, never rounded to bf16."""
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make(dtype=torch.bfloat16, bias=bias)
    gathered_N_K, lse_N = head_gather(hidden_N_H, weight_V_H, bias_V, ids_N_K, temperature=0.9, chunk_size=7)
    assert gathered_N_K.dtype == torch.float32 and lse_N.dtype == torch.float32
    up = [None if t is None else t.float() for t in (hidden_N_H, weight_V_H, bias_V)]
    logits_N_V = reference_logits(up[0], up[1], up[2], 0.9)  # autograd casts its grads back to bf16
    torch.testing.assert_close(gathered_N_K, logits_N_V.gather(1, ids_N_K), **TOL)
    torch.testing.assert_close(lse_N, logits_N_V.logsumexp(-1), **TOL)
    logprobs_N_K = gathered_N_K - lse_N[:, None]
    ref_logprobs_N_K = torch.log_softmax(logits_N_V, -1).gather(1, ids_N_K)
    ours = grads_of(logprobs_N_K.sum(), hidden_N_H, weight_V_H, bias_V)
    ref = grads_of(ref_logprobs_N_K.sum(), hidden_N_H, weight_V_H, bias_V)
    for got, want in zip(ours, ref, strict=True):
        assert got.dtype == torch.bfloat16
        # Both are fp32 gradients rounded once to bf16: at most an ulp apart.
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-5)


def test_cpu_autocast_keeps_fp32_logits() -> None:
    """bf16 autocast on CPU would only make the head slower and rounder: it stays fp32 there."""
    hidden_N_H, weight_V_H, _, ids_N_K = make(bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gathered_N_K, lse_N = head_gather(hidden_N_H, weight_V_H, None, ids_N_K, chunk_size=7)
    logits_N_V = reference_logits(hidden_N_H, weight_V_H, None, 1.0)
    torch.testing.assert_close(gathered_N_K, logits_N_V.gather(1, ids_N_K), **TOL)
    torch.testing.assert_close(lse_N, logits_N_V.logsumexp(-1), **TOL)
    (gathered_N_K - lse_N[:, None]).sum().backward()
    assert hidden_N_H.grad is not None and weight_V_H.grad is not None
    assert hidden_N_H.grad.dtype == torch.float32 and weight_V_H.grad.dtype == torch.float32


# Composite losses over (student logprobs at the teacher's/sampled ids); each maps log q_S [N, K] to a scalar.
def pg_loss(logq_N_K: Tensor, ctx: dict[str, Tensor]) -> Tensor:
    return -(ctx["adv_N"] * logq_N_K[:, 0]).sum()


def k1_loss(logq_N_K: Tensor, ctx: dict[str, Tensor]) -> Tensor:
    logq_N = logq_N_K[:, 0]
    return ((logq_N - ctx["logp_T_N"]).detach() * logq_N).sum()


def k3_loss(logq_N_K: Tensor, ctx: dict[str, Tensor]) -> Tensor:
    ratio_N = ctx["logp_T_N"] - logq_N_K[:, 0]
    return (ratio_N.exp() - ratio_N - 1).sum()


def topk_kl_loss(logq_N_K: Tensor, ctx: dict[str, Tensor]) -> Tensor:
    """Forward KL over the teacher's top-k plus one tail bucket; 0 * log 0 = 0 via xlogy."""
    logp_T_N_K = ctx["logp_T_N_K"]
    tail_T_N = (1 - logp_T_N_K.exp().sum(-1)).clamp_min(0)
    tail_S_N = (1 - logq_N_K.exp().sum(-1)).clamp_min(1e-12)
    head_N = (logp_T_N_K.exp() * (logp_T_N_K - logq_N_K)).sum(-1)
    tail_N = torch.xlogy(tail_T_N, tail_T_N) - torch.xlogy(tail_T_N, tail_S_N)
    return (head_N + tail_N).sum()


@pytest.mark.parametrize("loss_fn", [pg_loss, k1_loss, k3_loss, topk_kl_loss])
@pytest.mark.parametrize("chunk_size", [7, None])
def test_composite_loss_gradients_match_unchunked(
    loss_fn: Callable[[Tensor, dict[str, Tensor]], Tensor], chunk_size: int | None
) -> None:
    hidden_N_H, weight_V_H, bias_V, _ = make()
    gen = torch.Generator().manual_seed(2)
    teacher_N_V = torch.log_softmax(torch.randn(N, V, generator=gen) * 2, -1)
    logp_T_N_K, ids_N_K = teacher_N_V.topk(K, dim=-1)
    logp_T_N_K[0, -1] = 0.0  # one row with a zero teacher tail: the 0 * log 0 case
    ref_logq_N_K = torch.log_softmax(reference_logits(hidden_N_H, weight_V_H, bias_V, 1.0), -1).gather(
        1, ids_N_K
    )
    # k1/k3 compare at a sampled token with the teacher near the student, as on-policy: a large
    # exp(logp_T - logq_S) would amplify fp32 rounding in both paths past any fixed tolerance.
    near_N = ref_logq_N_K[:, 0].detach() + 0.5 * torch.randn(N, generator=gen)
    ctx = {"adv_N": torch.randn(N, generator=gen), "logp_T_N": near_N, "logp_T_N_K": logp_T_N_K}

    gathered_N_K, lse_N = head_gather(hidden_N_H, weight_V_H, bias_V, ids_N_K, chunk_size=chunk_size)
    loss = loss_fn(gathered_N_K - lse_N[:, None], ctx)
    ref_loss = loss_fn(ref_logq_N_K, ctx)
    torch.testing.assert_close(loss, ref_loss, **TOL)
    ours = grads_of(loss, hidden_N_H, weight_V_H, bias_V)
    ref = grads_of(ref_loss, hidden_N_H, weight_V_H, bias_V)
    for got, want in zip(ours, ref, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_tied_qwen3_gradients_match_model_logits_path() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).float()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    input_ids_B_T = torch.randint(0, 1000, (3, 12))
    attention_B_T = torch.ones(3, 12, dtype=torch.long)
    attention_B_T[1, 9:] = 0  # right padding: those rows never reach the head
    loss_mask_B_T = attention_B_T[:, 1:].clone()
    loss_mask_B_T[:, :4] = 0  # prompt positions
    adv_B_T = torch.randn(3, 11)

    def loss_of(logq_N: Tensor) -> Tensor:
        ratio_N = logq_N.detach() - 0.1 - logq_N  # a k3 term plus a policy-gradient term
        return (ratio_N.exp() - ratio_N - 1).sum() - (select_positions(adv_B_T, loss_mask_B_T) * logq_N).sum()

    def param_grads(loss: Tensor) -> dict[str, Tensor]:
        names, params = zip(*model.named_parameters(), strict=True)
        return dict(zip(names, torch.autograd.grad(loss, params), strict=True))

    logits_B_T_V = model(input_ids_B_T, attention_mask=attention_B_T).logits[:, :-1].float()
    ref_logq_N = select_positions(
        torch.log_softmax(logits_B_T_V, -1).gather(2, input_ids_B_T[:, 1:, None])[..., 0], loss_mask_B_T
    )
    ref = param_grads(loss_of(ref_logq_N))

    hidden_B_T_H = model.model(input_ids_B_T, attention_mask=attention_B_T).last_hidden_state
    weight_V_H, bias_V = output_head(model)
    hidden_N_H = select_positions(hidden_B_T_H[:, :-1], loss_mask_B_T)
    logq_N = token_logprobs(
        hidden_N_H, weight_V_H, bias_V, select_positions(input_ids_B_T[:, 1:], loss_mask_B_T), chunk_size=4
    )
    torch.testing.assert_close(logq_N, ref_logq_N, **TOL)
    ours = param_grads(loss_of(logq_N))
    assert ours.keys() == ref.keys() and "model.embed_tokens.weight" in ours
    for name, grad in ours.items():
        torch.testing.assert_close(grad, ref[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_output_head_with_bias_and_unsupported_heads() -> None:
    class LM(torch.nn.Module):
        def __init__(self, head: torch.nn.Module) -> None:
            super().__init__()
            self.head = head

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

    linear = torch.nn.Linear(H, V, bias=True)
    weight_V_H, bias_V = output_head(LM(linear))
    assert weight_V_H is linear.weight and bias_V is linear.bias
    with pytest.raises(TypeError):
        output_head(LM(torch.nn.Embedding(V, H)))
    capped = LM(linear)
    capped.config = type("Cfg", (), {"final_logit_softcapping": 30.0})()  # type: ignore[assignment]
    with pytest.raises(NotImplementedError):
        output_head(capped)


def test_positions_round_trip_and_empty_input() -> None:
    values_B_T = torch.arange(12.0).reshape(3, 4)
    mask_B_T = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
    picked_N = select_positions(values_B_T, mask_B_T)
    assert picked_N.tolist() == [0.0, 1.0, 5.0, 6.0, 7.0]
    assert torch.equal(scatter_positions(picked_N, mask_B_T), values_B_T * mask_B_T)
    hidden_0_H = torch.zeros(0, H, requires_grad=True)
    logprobs_0 = token_logprobs(hidden_0_H, torch.randn(V, H), None, torch.zeros(0, dtype=torch.long))
    assert logprobs_0.shape == (0,)
    logprobs_0.sum().backward()
    assert hidden_0_H.grad is not None and hidden_0_H.grad.shape == (0, H)


def test_default_chunk_is_one_chunk_for_small_vocabularies() -> None:
    assert default_chunk_rows(1000) >= 32 * 1024  # embedded / test models: no chunking overhead
    assert 128 <= default_chunk_rows(151_936) <= 512  # Qwen: a ~128 MiB fp32 block


def test_the_cpu_chunk_is_what_it_was_and_a_gpu_takes_bigger_blocks() -> None:
    # The CPU's rows, bit for bit as before the GPU sizing: 128 MiB // (4 V).
    for vocab in (97, 1000, 32_000, 151_936):
        assert default_chunk_rows(vocab) == default_chunk_rows(vocab, "cpu") == 2**27 // (4 * vocab)
        assert default_chunk_rows(vocab, torch.device("meta")) == 2**27 // (4 * vocab)
    assert default_chunk_rows(151_936, "cpu") == 220
    # A GPU: power-of-two rows, up to 1.5 GiB blocks and 1/64 of its memory.
    assert gpu_chunk_rows(151_936, 141 * 10**9) == 2048  # H200: the measured best
    assert gpu_chunk_rows(151_936, 80 * 10**9) == 2048  # H100: a 1.16 GiB block
    assert gpu_chunk_rows(151_936, 24 * 10**9) == 512
    assert gpu_chunk_rows(151_936) == 2048
    assert gpu_chunk_rows(32_000, 80 * 10**9) == 8192
    assert gpu_chunk_rows(10**9, 10**9) == 1  # never below one row
    for vocab, memory in ((151_936, 141 * 10**9), (1000, 8 * 10**9), (50_257, 40 * 10**9)):
        rows = gpu_chunk_rows(vocab, memory)
        assert rows & (rows - 1) == 0 and rows * 4 * vocab <= min(1536 * 2**20, memory // 64)
        assert rows * 2 * 4 * vocab > min(1536 * 2**20, memory // 64)  # the largest that fits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: the device's chunk and host syncs")
def test_cuda_chunk_loop_makes_no_host_sync() -> None:
    """On CUDA the default chunk is the GPU's, and the chunk loop's forward and backward run with
    torch's sync debug mode set to error: no .item(), .tolist() or data-dependent shape inside."""
    device = torch.device("cuda")
    memory = torch.cuda.get_device_properties(device).total_memory
    assert default_chunk_rows(151_936, device) == gpu_chunk_rows(151_936, memory)
    # CUDA leaves: a gradient flowing back to a CPU tensor would be a (legitimate) sync.
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make(bias=True)
    assert bias_V is not None
    hidden_N_H, weight_V_H, bias_V = (
        t.detach().cuda().requires_grad_() for t in (hidden_N_H, weight_V_H, bias_V)
    )
    ids_N_K = ids_N_K.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gathered_N_K, lse_N, _, _ = head_gather_topk(hidden_N_H, weight_V_H, bias_V, ids_N_K, 4, chunk_size=7)
        (gathered_N_K - lse_N[:, None]).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert hidden_N_H.grad is not None and bool(hidden_N_H.grad.isfinite().all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: the fp32-output half matmul")
@pytest.mark.parametrize("autocast", [False, True])
def test_cuda_half_close_to_fp32(autocast: bool) -> None:
    """bf16 params, or fp32 params under bf16 autocast: fp32 logits from a bf16 matmul."""
    hidden_N_H, weight_V_H, bias_V, ids_N_K = make(bias=True)
    dtype = torch.float32 if autocast else torch.bfloat16
    params = [
        t.detach().cuda().to(dtype).requires_grad_()
        for t in (hidden_N_H, weight_V_H, bias_V)
        if t is not None
    ]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        gathered_N_K, lse_N = head_gather(*params, ids_N_K.cuda(), chunk_size=7)
    ref_N_V = reference_logits(*[t.detach().float() for t in params], 1.0)
    torch.testing.assert_close(gathered_N_K, ref_N_V.gather(1, ids_N_K.cuda()), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse_N, ref_N_V.logsumexp(-1), rtol=2e-2, atol=2e-2)
    (gathered_N_K - lse_N[:, None]).sum().backward()
    assert all(t.grad is not None and t.grad.dtype == dtype for t in params)


MEMORY_PROBE = textwrap.dedent(
    """
    import json, os
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import torch
    torch.set_num_threads(1)
    from distill.kernels.heads import token_logprobs

    def kib(field):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

    n, h, v = 8 * 1024, 64, 151_936
    hidden = torch.randn(n, h, requires_grad=True)
    weight = (torch.randn(v, h) * 0.1).requires_grad_()
    targets = torch.randint(0, v, (n,))
    open("/proc/self/clear_refs", "w").write("5")  # reset the RSS high-water mark to now
    base = kib("VmRSS")
    token_logprobs(hidden, weight, None, targets).sum().backward()
    print(json.dumps({"peak_mib": (kib("VmHWM") - base) / 1024, "finite": bool(weight.grad.isfinite().all())}))
    """
)


@pytest.mark.integration
def test_memory_stays_far_below_full_logits() -> None:
    """8k rows x 151,936 vocab: full fp32 logits are 4.6 GiB each (~10 GiB with log_softmax's)."""
    proc = subprocess.run([sys.executable, "-c", MEMORY_PROBE], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["finite"]
    # Measured ~175 MiB: one 128 MiB logits block + the 37 MiB weight gradient.
    assert result["peak_mib"] < 600, result
