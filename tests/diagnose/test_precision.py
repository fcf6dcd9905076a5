"""Precision: dtype resolution, the numpy safetensors reader, and the rule on estimates and checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from distill.diagnose import Severity, load_run
from distill.diagnose.precision import half_spacing, measure_update, precision, read_sample, round_to

from .conftest import MakeRun
from .fake_runs import series_rows


def test_half_spacing_per_dtype() -> None:
    assert half_spacing("bf16") == pytest.approx(3.9e-3 / 2, rel=0.01)  # 2^-8 relative spacing, halved
    assert half_spacing("fp16") == 2.0**-12
    assert half_spacing("fp32") == pytest.approx(3.0e-8, rel=0.01)


def test_round_to_bf16_matches_torch_including_ties() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=gen) * 0.05
    # Exact ties between two bf16 neighbours: round-to-nearest-even must agree with torch.
    ties = (torch.tensor([1.0, 1.0078125, 0.5]).view(torch.int32) + 0x8000).view(torch.float32)
    x = torch.cat([x, ties])
    ours = round_to(x.numpy(), "bf16")
    assert (torch.from_numpy(ours) == x.to(torch.bfloat16).to(torch.float32)).all()
    assert (torch.from_numpy(round_to(x.numpy(), "fp16")) == x.to(torch.float16).to(torch.float32)).all()


def test_read_sample_reads_bf16_and_fp32_without_torch(tmp_path: Path) -> None:
    w = torch.randn(8, 16)
    save_file({"a": w, "b": w.to(torch.bfloat16)}, tmp_path / "model.safetensors")
    dtype, a = read_sample(tmp_path / "model.safetensors", "a")
    assert dtype == "fp32" and (torch.from_numpy(a) == w.flatten()).all()
    dtype, b = read_sample(tmp_path / "model.safetensors", "b", limit=10)
    assert dtype == "bf16" and b.size == 10
    assert (torch.from_numpy(b) == w.to(torch.bfloat16).to(torch.float32).flatten()[:10]).all()


def test_reference_case_estimate_bf16_lr_1e6_advantage_1e2(make_run: MakeRun) -> None:
    """No checkpoints, no measured ratio: the estimate alone names bf16 as the cause."""
    metrics = series_rows(20, train__loss=lambda s: 0.1, kl__advantage_mean=lambda s: 1e-2)
    make_run("bf16", config={"student.precision": "bf16", "optim.lr": 1e-6}, metrics=metrics)
    [f] = precision(load_run("bf16"))
    assert f.severity is Severity.ERROR and "round to zero in bf16" in f.title
    ev = {e.source: e.value for e in f.evidence}
    assert ev["estimate lr x |kl/advantage_mean|"] == pytest.approx(1e-8)  # the reference's number
    assert ev["estimate lr/|w|"] == pytest.approx(1e-6 / 0.02)
    assert [x.override for x in f.fixes][0] == "student.precision=fp32"
    make_run("fp32", config={"student.precision": "fp32", "optim.lr": 1e-6}, metrics=metrics)
    assert precision(load_run("fp32")) == []  # the same lr resolves fine in fp32


def test_measured_update_ratio_wins(make_run: MakeRun) -> None:
    make_run(
        "tiny",
        config={"student.precision": "bf16", "optim.lr": 1e-3},
        metrics=series_rows(5, train__update_ratio=lambda s: 1e-6),
    )
    [f] = precision(load_run("tiny"))
    assert f.severity is Severity.ERROR and f.evidence[2].source == "train/update_ratio"
    make_run(
        "fine",
        config={"student.precision": "bf16", "optim.lr": 1e-6},
        metrics=series_rows(5, train__update_ratio=lambda s: 1e-2),
    )
    assert precision(load_run("fine")) == []


def _weights(scale: float = 0.02) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {"w": torch.randn(64, 64, generator=gen) * scale, "norm": torch.ones(64)}


def test_checkpoints_bit_identical_in_bf16_is_an_error(make_run: MakeRun, tmp_path: Path) -> None:
    start = tmp_path / "student"
    start.mkdir()
    w0 = _weights()
    save_file(w0, start / "model.safetensors")
    run = make_run(
        "stuck", config={"student.precision": "bf16", "optim.lr": 1e-6, "student.name": str(start)}
    )
    ckpt = run / "checkpoints" / "step-3"
    ckpt.mkdir(parents=True)
    # What a bf16 run saves when every update rounded away: the start weights, cast once at load.
    save_file({k: v.to(torch.bfloat16) for k, v in w0.items()}, ckpt / "model.safetensors")
    move = measure_update(load_run("stuck"))
    assert move is not None and move.changed == 0 and move.elements == 64 * 64 + 64 and move.dtype == "bf16"
    [f] = precision(load_run("stuck"))
    assert f.severity is Severity.ERROR
    assert f.title == "updates round to zero in bf16: 100.0% of weights bit-identical to the start"


def test_checkpoints_that_moved_are_fine_and_earliest_vs_latest(make_run: MakeRun) -> None:
    run = make_run(
        "moved", config={"student.precision": "fp32", "optim.lr": 1e-4, "student.name": "hub/model"}
    )
    w0 = _weights()
    for step, shift in ((2, 0.0), (4, 1e-3)):
        ckpt = run / "checkpoints" / f"step-{step}"
        ckpt.mkdir(parents=True)
        save_file({k: v + shift for k, v in w0.items()}, ckpt / "model.safetensors")
    move = measure_update(load_run("moved"))
    assert move is not None and (move.start, move.end, move.steps) == (
        "checkpoints/step-2",
        "checkpoints/step-4",
        2,
    )
    assert move.changed_fraction > 0.99
    assert precision(load_run("moved")) == []


def _lora_checkpoints(run: Path, lr: float, steps: int = 2) -> None:
    """A bf16 student trained through peft LoRA with Adam, saved as a real run saves it: each
    checkpoint folder holds peft's adapter_model.safetensors (fp32 adapters), no model weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    base = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    for step in range(1, steps + 1):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.save_pretrained(run / "checkpoints" / f"step-{step}")


def test_lora_adapters_are_judged_in_their_own_dtype(make_run: MakeRun) -> None:
    """A bf16 LoRA run trains fp32 adapters: lr 1e-5 moves them (no finding), where the same lr on
    bf16 weights would round away (the estimate the rule used to fall back on)."""
    run = make_run(
        "lora",
        config={"student.precision": "bf16", "optim.lr": 1e-5, "lora.enabled": True},
        metrics=series_rows(2, train__loss=lambda s: 1.0, train__grad_norm=lambda s: 1.0),
    )
    _lora_checkpoints(run, lr=1e-5)
    ckpt = run / "checkpoints" / "step-2"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    move = measure_update(load_run("lora"))
    assert move is not None and move.dtype == "fp32" and move.start == "checkpoints/step-1"
    assert move.changed_fraction > 0.9
    assert precision(load_run("lora")) == []
    # Without a checkpoint to read, LoRA still means fp32 adapters: no bf16 estimate fires.
    make_run(
        "lora-early",
        config={"student.precision": "bf16", "optim.lr": 1e-6, "lora.enabled": True},
        metrics=series_rows(5, train__loss=lambda s: 0.1, kl__advantage_mean=lambda s: 1e-2),
    )
    assert precision(load_run("lora-early")) == []
