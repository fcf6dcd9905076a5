"""What a step costs the hardware: model FLOPs utilisation and peak GPU memory (`perf/mfu`,
`perf/gpu_mem_peak_gb`). A leaf: no distill imports; torch only inside the functions that read
a device.

MFU is counted PaLM-style (Chowdhery et al. 2022, appendix B): a training token costs
6 N + 12 L (heads x head_dim) S FLOPs (N parameters, the tied embedding once; L layers; S the
sequence length the token attends over, not halved for causality), a forward-only token a third
of that; recomputation under gradient checkpointing is not counted (that would be hardware FLOPs
utilisation). Divided by the step time and the device's dense bf16 peak (`peak_flops`, by GPU
name). On the CPU there is no peak to divide by: MFU is None and the metrics are absent.

Memory is counted in GiB (2^30 bytes), as torch's memory summary and nvidia-smi count it.
"""

from __future__ import annotations

from typing import Any

GIB = 2**30

# Dense bf16 tensor-core peak, FLOP/s (no sparsity), by a lower-case substring of the device name;
# the first match wins, so the specific names (PCIe, NVL) come before the family's.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("gh200", 989e12),
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),
    ("h800", 989e12),
    ("h20", 148e12),
    ("b200", 2250e12),
    ("b100", 1750e12),
    ("a100", 312e12),
    ("a800", 312e12),
    ("l40s", 362e12),
    ("l40", 181e12),
    ("l4", 121e12),
    ("a10g", 70e12),
    ("a10", 125e12),
    ("mi300x", 1307e12),
    ("mi250x", 383e12),
)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak FLOP/s of a GPU by its name (`torch.cuda.get_device_name`), None when
    the table does not know it."""
    name = device_name.lower()
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def attention_flops_per_token(layers: int, attn_width: int, seq_len: int) -> float:
    """PaLM's attention term of one forward token: 2 L (heads x head_dim) S for QK^T and as much
    for the values, i.e. 4 L A S (its training count 12 L A S is three times that)."""
    return 4.0 * layers * attn_width * seq_len


def flops_per_token(params: int, layers: int, attn_width: int, seq_len: int, training: bool = True) -> float:
    """PaLM-style FLOPs of one token: 6 N + 12 L A S in training (forward + backward), 2 N + 4 L A S
    forward only; A = heads x head_dim (the hidden size for most models, not for all)."""
    forward = 2.0 * params + attention_flops_per_token(layers, attn_width, seq_len)
    return 3.0 * forward if training else forward


def mfu(
    params: int,
    tokens: int,
    seq_len: int,
    layers: int,
    attn_width: int,
    step_time_s: float,
    peak: float | None,
    training: bool = True,
) -> float | None:
    """Model FLOPs utilisation of a step that processed `tokens` tokens (all rows, prompt and
    completion) of sequences `seq_len` long in `step_time_s` on a device of `peak` FLOP/s; None
    without a peak (the CPU, an unknown GPU) or a time."""
    if peak is None or peak <= 0 or step_time_s <= 0:
        return None
    return flops_per_token(params, layers, attn_width, seq_len, training) * tokens / step_time_s / peak


def model_shape(model: Any) -> dict[str, int]:
    """(params, layers, attn_width) of a transformers model, from its config and parameters
    (tied weights once): what `mfu` needs besides the step's tokens and time."""
    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    seen: set[int] = set()
    params = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params += getattr(p, "ds_numel", p.numel())  # ZeRO-3 partitions p to 0 elements
    return {"params": params, "layers": int(config.num_hidden_layers), "attn_width": heads * int(head_dim)}


def device_peak(device: Any) -> float | None:
    """`peak_flops` of a torch device (None for the CPU and for GPUs the table does not know)."""
    import torch

    where = torch.device(device)
    if where.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(where))


def reset_gpu_peak(device: Any) -> None:
    """Start a step's peak-memory window (a no-op off CUDA)."""
    import torch

    where = torch.device(device)
    if where.type == "cuda":
        torch.cuda.reset_peak_memory_stats(where)


def gpu_mem_peak_gb(device: Any) -> float | None:
    """The peak memory torch allocated on `device` since the last `reset_gpu_peak`, in GiB; None
    off CUDA."""
    import torch

    where = torch.device(device)
    if where.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(where) / GIB


def step_metrics(
    shape: dict[str, int], tokens: int, seq_len: int, step_time_s: float, device: Any
) -> dict[str, float]:
    """The step's `perf/mfu` and `perf/gpu_mem_peak_gb` where they exist (on CUDA; MFU also needs
    a GPU the peak table knows), nothing on the CPU. `shape`: `model_shape(model)`."""
    out: dict[str, float] = {}
    value = mfu(
        shape["params"],
        tokens,
        seq_len,
        shape["layers"],
        shape["attn_width"],
        step_time_s,
        device_peak(device),
    )
    if value is not None:
        out["perf/mfu"] = value
    peak = gpu_mem_peak_gb(device)
    if peak is not None:
        out["perf/gpu_mem_peak_gb"] = peak
    return out
