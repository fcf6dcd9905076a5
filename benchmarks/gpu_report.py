"""benchmarks/gpu_step.py's results: one record per (row, path), with its ratios to the naive path
and to Liger, and its numbers against distill's path of the same row; <out>.json and <out>.md
rewritten after every row, so a run cut short keeps what it measured."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

COLUMNS = (
    ("part", "part"), ("shape", "B x (P+T)"), ("loss", "loss"), ("ckpt", "ckpt"), ("path", "path"),
    ("status", "status"), ("median_ms", "median ms"), ("peak_added_gib", "peak added GiB"),
    ("tokens_per_s", "tokens/s"), ("mfu_pct", "MFU %"), ("time_vs_naive", "time / naive"),
    ("mem_vs_naive", "mem / naive"), ("time_vs_liger", "time / liger"), ("value", "loss value"),
    ("vs_distill", "vs distill"), ("note", "note"),
)  # fmt: skip


def label(fields: dict[str, Any]) -> str:
    return " | ".join(
        str(fields[k]) for k in ("part", "shape", "loss", "ckpt") if fields.get(k) not in (None, "-")
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def _compare(out: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """How a path's outputs differ from distill's on the same row (loss, logprobs, tokens)."""
    diffs: dict[str, float] = {}
    if "loss" in out and "loss" in ref:
        diffs["rel_dloss"] = abs(float(out["loss"]) - float(ref["loss"])) / max(
            abs(float(ref["loss"])), 1e-12
        )
    for key in ("logp", "top_logp"):
        if key in out and key in ref and out[key].shape == ref[key].shape:
            diffs[f"max_d{key}"] = float((out[key] - ref[key]).abs().max())
    if "tokens" in out and "tokens" in ref and out["tokens"].shape == ref["tokens"].shape:
        diffs["token_agreement"] = float((out["tokens"] == ref["tokens"]).float().mean())
    return diffs


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.3g}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value).replace("|", "/")


class Report:
    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        base = out.with_suffix("") if out.suffix in (".json", ".md") else out
        base.parent.mkdir(parents=True, exist_ok=True)
        self.json_path, self.md_path = base.with_suffix(".json"), base.with_suffix(".md")
        self.meta = meta
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        print(
            f"[done] {label(row)} | {row['path']}: {row['status']} {row.get('note') or ''}".rstrip(),
            flush=True,
        )
        self.write()

    def add_group(
        self,
        fields: dict[str, Any],
        results: dict[str, dict[str, Any]],
        tokens: int,
        flops_per_token: float | None,
        peak_flops: float | None,
    ) -> None:
        """One record per path of a row measured together."""
        summary = {}
        for name, res in results.items():
            times, peaks = res["times"], [p for p in res["peaks"] if p is not None]
            median = statistics.median(times) if times and res["status"] == "ok" else None
            summary[name] = {"median_ms": median, "peak": max(peaks) if peaks and median else None}
        naive, liger = summary.get("naive", {}), summary.get("liger", {})
        ref = results.get("distill", {}).get("out", {})
        for name, res in results.items():
            median, peak = summary[name]["median_ms"], summary[name]["peak"]
            out = res["out"]
            value = float(out["loss"]) if "loss" in out else None
            diffs = _compare(out, ref) if out and name != "distill" else {}
            mfu = None
            if median and flops_per_token and peak_flops:
                mfu = 100 * flops_per_token * tokens / (median / 1e3) / peak_flops
            row = {
                **fields, "path": name, "status": res["status"], "median_ms": median,
                "min_ms": min(res["times"]) if median else None, "times_ms": res["times"],
                "peak_added_gib": peak, "tokens": tokens,
                "tokens_per_s": tokens / (median / 1e3) if median else None, "mfu_pct": mfu,
                "time_vs_naive": _ratio(median, naive.get("median_ms")) if name != "naive" else None,
                "mem_vs_naive": _ratio(peak, naive.get("peak")) if name != "naive" else None,
                "time_vs_liger": _ratio(median, liger.get("median_ms")) if name != "liger" else None,
                "value": value, "vs_distill": diffs, "note": res["note"],
            }  # fmt: skip
            if "traceback" in res:
                row["traceback"] = res["traceback"]
            self.add(row)

    def write(self) -> None:
        self.json_path.write_text(json.dumps({"meta": self.meta, "rows": self.rows}, indent=1, default=str))
        lines = [f"## benchmarks/gpu_step.py: {self.meta.get('device')}", ""]
        lines.append(", ".join(f"{k} {v}" for k, v in self.meta.items() if k not in ("teacher", "student")))
        for role in ("teacher", "student"):
            if role in self.meta:
                lines.append(f"{role}: {self.meta[role]}")
        lines += ["", "| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for row in self.rows:
            lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in COLUMNS) + " |")
        self.md_path.write_text("\n".join(lines) + "\n")
