"""Precision: is the per-step relative update below the resolution of the weights' dtype?

A float with m mantissa bits can only change a weight w by multiples of its spacing, which is
between w*2^-m and w*2^-(m+1); an update smaller than half the smallest relative spacing,
2^-(m+2), rounds back to the old value. bf16 (m=7): half-spacing 1.95e-3 of the weight; fp32:
3.0e-8. Adam moves each weight by about lr per step regardless of the gradient's scale, so the
relative update is ~lr/|w|: at lr 1e-6 and |w|~0.02 that is 5e-5, far below bf16's resolution
(the reference's OPD bf16 runs; their estimate lr x advantage 1e-6 x 1e-2 = 1e-8 says the same).

Measured beats estimated: `train/update_ratio` when logged, else the student's start weights
compared with its latest checkpoint, read straight from safetensors with numpy (no torch import:
diagnose stays instant). Only a bounded sample of each tensor is read, so 30B checkpoints are fine.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, pct
from distill.diagnose.records import RunRecord

MANTISSA_BITS = {"fp32": 23, "bf16": 7, "fp16": 10}
TORCH_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
ST_NAMES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}
ST_ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2}
# Without start weights: the init std of transformer matrices, a typical |w| for an LLM.
ASSUMED_WEIGHT = 0.02
STUCK_FRACTION = 0.05  # fewer weights than this changed: the updates rounded away
PARTLY_STUCK_FRACTION = 0.5
PER_TENSOR, TOTAL = 65_536, 4_000_000


def half_spacing(dtype: str) -> float:
    """The relative update below which a weight of this dtype never changes."""
    return 2.0 ** -(MANTISSA_BITS[dtype] + 2)


def _header(path: Path) -> tuple[dict[str, dict], int]:
    """A safetensors file's tensor table and where its data starts (read once per file version)."""
    stat = path.stat()
    return _read_header(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _read_header(path: Path, mtime_ns: int, size: int) -> tuple[dict[str, dict], int]:
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    return {k: v for k, v in header.items() if k != "__metadata__"}, 8 + length


ADAPTER = "adapter_model.safetensors"


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file of the weights a run trains: a LoRA save's adapters (peft's
    `adapter_model.safetensors`; the base weights are frozen), else the full model, single-file
    or sharded; {} when there is none."""
    adapter = model_dir / ADAPTER
    if adapter.is_file():
        return {name: adapter for name in _header(adapter)[0]}
    single = model_dir / "model.safetensors"
    if single.is_file():
        return {name: single for name in _header(single)[0]}
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: model_dir / file for name, file in weight_map.items()}
    return {}


def read_sample(path: Path, name: str, limit: int = PER_TENSOR) -> tuple[str, np.ndarray] | None:
    """The first `limit` elements of one tensor as float32, and its stored dtype."""
    header, base = _header(path)
    meta = header.get(name)  # the cached header is shared: read it, never mutate it
    if meta is None or meta["dtype"] not in ST_ITEMSIZE:
        return None
    size = ST_ITEMSIZE[meta["dtype"]]
    start, end = meta["data_offsets"]
    count = min(limit, (end - start) // size)
    with path.open("rb") as fh:
        fh.seek(base + start)
        raw = fh.read(count * size)
    if meta["dtype"] == "BF16":
        values = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif meta["dtype"] == "F16":
        values = np.frombuffer(raw, "<f2").astype(np.float32)
    else:
        values = np.frombuffer(raw, "<f4").copy()
    return ST_NAMES[meta["dtype"]], values


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as the run loaded them in `dtype` (round to nearest even, as torch casts)."""
    if dtype == "bf16":
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return rounded.astype(np.uint32).view(np.float32)
    if dtype == "fp16":
        return values.astype(np.float16).astype(np.float32)
    return values.astype(np.float32)


@dataclass
class WeightMove:
    start: str
    end: str
    steps: int
    dtype: str
    elements: int
    changed: int
    rel_update: float  # ||w_end - w_start|| / ||w_start|| over the sampled elements
    weight_scale: float  # mean |w| of the sampled matrices (ndim >= 2: norms sit near 1)

    @property
    def changed_fraction(self) -> float:
        return self.changed / self.elements if self.elements else math.nan

    @property
    def per_step(self) -> float:
        return self.rel_update / max(1, self.steps)


def _checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    folder = run_dir / "checkpoints"
    found = []
    for child in folder.glob("step-*") if folder.is_dir() else []:
        if child.name[5:].isdigit() and tensor_files(child):
            found.append((int(child.name[5:]), child))
    return sorted(found)


def _start_dir(rec: RunRecord) -> Path | None:
    for ref in (rec.manifest.get("models", {}).get("student", {}).get("path"), rec.cfg("student.name")):
        if isinstance(ref, str) and Path(ref).is_dir() and tensor_files(Path(ref)):
            return Path(ref)
    return None


def compare_weights(a_dir: Path, b_dir: Path, steps: int, a_label: str, b_label: str) -> WeightMove | None:
    a_files, b_files = tensor_files(a_dir), tensor_files(b_dir)
    delta_sq = base_sq = scale_sum = 0.0
    elements = changed = scale_n = 0
    dtype = "fp32"
    for name in sorted(set(a_files) & set(b_files)):
        if elements >= TOTAL:
            break
        a, b = read_sample(a_files[name], name), read_sample(b_files[name], name)
        if a is None or b is None or a[1].size != b[1].size:
            continue
        dtype = b[0]
        # The run loaded the start weights in the checkpoint's dtype: compare in that dtype, or
        # the load rounding would count as an update.
        start, end = round_to(a[1], dtype), b[1]
        diff = (end - start).astype(np.float64)
        changed += int(np.count_nonzero(diff))
        elements += int(diff.size)
        delta_sq += float((diff * diff).sum())
        base_sq += float((start.astype(np.float64) ** 2).sum())
        if len(_header(a_files[name])[0][name]["shape"]) >= 2:
            scale_sum += float(np.abs(start).sum())
            scale_n += int(start.size)
    if not elements:
        return None
    return WeightMove(
        start=a_label,
        end=b_label,
        steps=steps,
        dtype=dtype,
        elements=elements,
        changed=changed,
        rel_update=math.sqrt(delta_sq / base_sq) if base_sq > 0 else math.nan,
        weight_scale=scale_sum / scale_n if scale_n else ASSUMED_WEIGHT,
    )


def is_adapter(model_dir: Path) -> bool:
    return (model_dir / ADAPTER).is_file()


def stored_dtype(model_dir: Path) -> str | None:
    """The dtype most of a save's tensors are stored in (fp32 / bf16 / fp16), None if unknown."""
    counts: dict[str, int] = {}
    for path in set(tensor_files(model_dir).values()):
        for meta in _header(path)[0].values():
            name = ST_NAMES.get(meta.get("dtype", ""))
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


def measure_update(rec: RunRecord) -> WeightMove | None:
    """Start weights vs the latest checkpoint; else the earliest vs the latest checkpoint. LoRA
    adapters have no start weights to compare with (B starts at 0): checkpoints only."""
    ckpts = _checkpoints(rec.run_dir)
    if not ckpts:
        return None
    last_step, last = ckpts[-1]
    start = None if is_adapter(last) else _start_dir(rec)
    if start is not None:
        return compare_weights(start, last, last_step, "start weights", f"checkpoints/{last.name}")
    if len(ckpts) >= 2:
        first_step, first = ckpts[0]
        return compare_weights(
            first, last, last_step - first_step, f"checkpoints/{first.name}", f"checkpoints/{last.name}"
        )
    return None


def trained_weights(rec: RunRecord) -> tuple[str, str]:
    """(dtype, what) of the weights the optimizer updates. LoRA trains adapters, which peft keeps
    in fp32 under a bf16/fp16 base (`autocast_adapter_dtype`): their dtype is what the latest
    checkpoint stores, else fp32; without LoRA, the student's precision."""
    ckpts = _checkpoints(rec.run_dir)
    if ckpts and is_adapter(ckpts[-1][1]):
        dtype = stored_dtype(ckpts[-1][1]) or "fp32"
        return dtype, f"LoRA adapters, {dtype} in checkpoints/{ckpts[-1][1].name}/{ADAPTER}"
    if rec.cfg("lora.enabled") is True:
        return "fp32", "LoRA adapters (peft keeps them in fp32; no checkpoint to read)"
    dtype = weights_dtype(rec)
    return dtype, f"the student's weights ({dtype})"


def weights_dtype(rec: RunRecord) -> str:
    precision = rec.cfg("student.precision")
    if precision in MANTISSA_BITS:
        return str(precision)
    stored = rec.manifest.get("models", {}).get("student", {}).get("dtype")
    return TORCH_NAMES.get(str(stored), "fp32")


def _measured_verdict(
    rec: RunRecord, dtype: str, half: float, move: WeightMove | None, evidence: list[Evidence]
) -> tuple[Severity, str] | None:
    """From a logged update ratio or a checkpoint comparison: (severity, title), or None when
    the updates are resolved (no finding). Without either, (INFO, "") defers to the estimate."""
    low = dtype != "fp32"
    measured = rec.get("train/update_ratio")
    if measured is not None:
        ratio = measured.median()
        evidence.append(Evidence("train/update_ratio", ratio, measured.span(), "median |dw|/|w| per step"))
        if ratio >= half:
            return None
        severity = Severity.ERROR if low else Severity.WARNING
        return (
            severity,
            f"per-step updates ({fmt(ratio)} of a weight) are below {dtype} resolution ({fmt(half)})",
        )
    if move is None:
        return Severity.INFO, ""
    frac = move.changed_fraction
    evidence.append(
        Evidence(
            f"{move.end} vs {move.start}",
            f"{move.changed}/{move.elements} sampled weights changed",
            note=f"{pct(frac)} after {move.steps} steps, compared in {move.dtype}",
        )
    )
    evidence.append(Evidence("|dw|/|w|", move.rel_update, note=f"~{fmt(move.per_step)} per step"))
    if frac >= PARTLY_STUCK_FRACTION or (not low and frac >= STUCK_FRACTION):
        return None
    if frac >= STUCK_FRACTION:
        return (
            Severity.WARNING,
            f"most updates round away in {dtype}: {pct(1 - frac)} of weights never changed",
        )
    if low:
        return (
            Severity.ERROR,
            f"updates round to zero in {dtype}: {pct(1 - frac)} of weights bit-identical to the start",
        )
    return Severity.WARNING, f"weights barely moved: {pct(1 - frac)} unchanged after {move.steps} steps"


def _estimates(
    rec: RunRecord, lr: float, scale: float, measured_move: bool, evidence: list[Evidence]
) -> float:
    """The estimates, always shown: they explain the measurement (or stand in for it)."""
    adam_rel = lr / scale
    evidence.append(
        Evidence(
            "estimate lr/|w|",
            adam_rel,
            note=f"Adam moves a weight ~lr per step; |w| ~ {fmt(scale)}"
            + ("" if measured_move else " (assumed)"),
        )
    )
    signal = rec.get("kl/advantage_mean") or rec.get("train/grad_norm")
    if signal is not None:
        est = lr * abs(signal.median())
        evidence.append(
            Evidence(
                f"estimate lr x |{signal.key}|",
                est,
                signal.span(),
                "the reference's estimate: 1e-6 x 1e-2 = 1e-8 in bf16",
            )
        )
    return adam_rel


def _fixes(dtype: str, half: float, scale: float, lr: float) -> tuple[list[Fix], str]:
    """(fixes, advice). No lr above the run's own is suggested (schedule.ceiling): the lr at which
    a bf16 weight would move at all is said in words, as the reason fp32 is the fix."""
    if dtype != "fp32":
        return (
            [Fix("student.precision", "fp32", "fp32 weights resolve updates down to 3e-8 of a weight")],
            f"in {dtype} a typical weight (|w| ~ {fmt(scale)}) moves only at lr >= {fmt(half * scale)}, "
            f"{fmt(half * scale / lr) if lr > 0 else '?'}x this run's; that is usually too large to train "
            "stably: prefer fp32 weights",
        )
    return (
        [],
        f"the weights are not moving at lr {fmt(lr)}: check that the loss reaches the trained weights "
        "(a frozen module, a zero advantage), then try larger lrs in short runs and compare them",
    )


def precision(rec: RunRecord) -> list[Finding]:
    dtype, what = trained_weights(rec)
    half = half_spacing(dtype)
    low = dtype != "fp32"
    lr_cfg = rec.cfg("optim.lr")
    lr_s = rec.get("train/lr")
    lr = float(lr_cfg) if isinstance(lr_cfg, int | float) else (lr_s.median() if lr_s else math.nan)
    measured = rec.get("train/update_ratio")
    move = measure_update(rec) if measured is None else None
    scale = move.weight_scale if move else ASSUMED_WEIGHT
    evidence = [
        Evidence("trained weights", what, note=f"updates below {fmt(half)} of a weight round away"),
        Evidence("optim.lr", lr),
    ]
    verdict = _measured_verdict(rec, dtype, half, move, evidence)
    if verdict is None:
        return []
    severity, title = verdict
    adam_rel = _estimates(rec, lr, scale, move is not None, evidence)
    if measured is None and move is None:
        if not low or adam_rel >= 10 * half:
            return []
        if adam_rel < half:
            severity = Severity.ERROR
            title = f"updates round to zero in {dtype}: ~{fmt(adam_rel)} per step vs resolution {fmt(half)}"
        else:
            severity = Severity.WARNING
            title = f"updates near {dtype} resolution: ~{fmt(adam_rel)} per step vs {fmt(half)}"
    fixes, advice = _fixes(dtype, half, scale, lr)
    return [
        Finding(
            name="precision",
            severity=severity,
            title=title,
            evidence=evidence,
            why=f"A {dtype} weight changes only in steps of ~|w|*2^-{MANTISSA_BITS[dtype] + 1}; a smaller update "
            "rounds back to the old value, so training runs, losses are logged and nothing is learned. "
            "Reference: OPD bf16 and fp32 runs differed only in dtype (lr 1e-6, advantage ~1e-2); "
            "fp32 reached avg@8 0.069, bf16 0.046.",
            fixes=fixes,
            advice=advice,
        )
    ]
