"""perf/mfu and perf/gpu_mem_peak_gb: PaLM-style FLOPs per token, the peak table, and nothing on
the CPU (a CPU has no bf16 tensor-core peak to divide by, nor a CUDA allocator to ask)."""

from __future__ import annotations

import pytest
import torch

from distill import hardware

# Qwen3-1.7B (tied embeddings counted once): 28 layers, 16 heads x 128.
QWEN3_1_7B = {"params": 1_720_574_976, "layers": 28, "attn_width": 2048}


def test_palm_flops_per_token() -> None:
    # 6 N + 12 L A S in training, a third of it forward only.
    train = hardware.flops_per_token(1000, 2, 8, 16)
    assert train == 6 * 1000 + 12 * 2 * 8 * 16
    assert hardware.flops_per_token(1000, 2, 8, 16, training=False) == 2 * 1000 + 4 * 2 * 8 * 16
    assert hardware.attention_flops_per_token(2, 8, 16) == 4 * 2 * 8 * 16


def test_mfu_of_the_issues_h200_row() -> None:
    """The H200's student step (8 x 4,352 tokens, checkpointing on, 1,683.9 ms): 21.6% counting
    6 N alone (the issue), ~28% with PaLM's attention term."""
    shape, tokens, seq = QWEN3_1_7B, 8 * 4352, 4352
    six_n = 6 * shape["params"] * tokens / 1.6839 / 989e12
    assert six_n == pytest.approx(0.216, abs=0.001)
    value = hardware.mfu(shape["params"], tokens, seq, shape["layers"], shape["attn_width"], 1.6839, 989e12)
    assert value == pytest.approx(0.279, abs=0.001)
    assert hardware.mfu(1, 1, 1, 1, 1, 1.0, None) is None  # no peak: the CPU, an unknown GPU
    assert hardware.mfu(1, 1, 1, 1, 1, 0.0, 989e12) is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H20", 148e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A10G", 70e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_peak_by_gpu_name(name: str, peak: float | None) -> None:
    assert hardware.peak_flops(name) == peak


def test_model_shape_counts_a_tied_head_once() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    shape = hardware.model_shape(model)
    assert shape["layers"] == 2 and shape["attn_width"] == 4 * 16  # not the hidden size (32)
    assert shape["params"] == sum(p.numel() for p in model.parameters())
    assert shape["params"] < sum(p.numel() for p in model.state_dict().values())  # the tie


def test_nothing_on_the_cpu() -> None:
    assert hardware.device_peak("cpu") is None
    assert hardware.gpu_mem_peak_gb("cpu") is None
    hardware.reset_gpu_peak("cpu")
    assert hardware.step_metrics(QWEN3_1_7B, 8 * 4352, 4352, 1.7, torch.device("cpu")) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: the allocator's peak")
def test_gpu_peak_memory_and_mfu_on_cuda() -> None:
    device = torch.device("cuda")
    hardware.reset_gpu_peak(device)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    peak = hardware.gpu_mem_peak_gb(device)
    assert peak is not None and peak >= 0.25
    del block
    metrics = hardware.step_metrics(QWEN3_1_7B, 8 * 4352, 4352, 1.7, device)
    assert metrics["perf/gpu_mem_peak_gb"] >= 0.25
    known = hardware.peak_flops(torch.cuda.get_device_name(device)) is not None
    assert ("perf/mfu" in metrics) == known
