"""benchmarks/gpu_step.py --smoke: every part's distill path runs beside the naive one at tiny
shapes on the CPU and agrees with it (losses, logprobs, decoded tokens), the GPU-only paths are
recorded as not run, and the results are written as they come. So the GPU table cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step.py"


def _main() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_step", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_step", module)
    spec.loader.exec_module(module)
    return module.main


def test_smoke_runs_every_part_and_agrees_with_the_naive_path(tmp_path: Path) -> None:
    import torch

    from distill.kernels.heads import default_chunk_rows

    if torch.cuda.is_available():
        pytest.skip("the smoke test is the CPU's; on a GPU run the benchmark itself")
    result = _main()(["--smoke", "--out", str(tmp_path / "gpu")])
    rows = {(r["part"], r["loss"], r["ckpt"], r["path"]): r for r in result["rows"]}
    assert result["meta"]["default_chunk_rows"] == default_chunk_rows(1000)
    losses = ["token_reward_direct", "k1", "k3", "forward_kl_topk", "jsd(beta=0.5)"]
    trained = [("opd", loss, "on") for loss in losses] + [("ce", "ce", "on")]
    for key in [("score", "top-32", "-"), *trained]:
        distill, naive = rows[(*key, "distill")], rows[(*key, "naive")]
        assert distill["status"] == naive["status"] == rows[(*key, "distill chunk=7")]["status"] == "ok", key
        assert distill["median_ms"] > 0 and distill["tokens_per_s"] > 0 and distill["mfu_pct"] is None
        assert distill["time_vs_naive"] == pytest.approx(distill["median_ms"] / naive["median_ms"])
        # CPU, fp32: distill's chunked head is the naive path's arithmetic, chunk by chunk.
        for diff, value in naive["vs_distill"].items():
            assert value < 1e-4, (key, diff, value)
        assert naive["vs_distill"], key
        assert rows[(*key, "liger")]["status"] == rows[(*key, "distill+compile")]["status"] == "n/a"
    assert "Triton/CUDA" in rows[("opd", "k1", "on", "liger")]["note"]
    assert "no top-k forward KL" in rows[("opd", "forward_kl_topk", "on", "liger")]["note"]
    decode = [r for r in result["rows"] if r["part"] == "decode"]
    assert [r["path"] for r in decode] == ["distill", "distill model-call loop", "generate"]
    for row in decode:
        assert row["status"] == "ok" and row["tokens"] == 2 * 6
        assert row["path"] == "distill" or row["vs_distill"]["token_agreement"] == 1.0
    written = json.loads((tmp_path / "gpu.json").read_text())
    assert len(written["rows"]) == len(result["rows"])
    table = [line for line in (tmp_path / "gpu.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(result["rows"])


def test_a_failing_path_is_recorded_and_the_others_still_run(tmp_path: Path) -> None:
    """An error in one path (here: a loss name no path knows) is that row's status, not the run's end."""
    result = _main()(["--smoke", "--out", str(tmp_path / "gpu"), "--parts", "opd", "--losses", "k1,nonsense"])
    statuses = {(r["loss"], r["path"]): r["status"] for r in result["rows"]}
    assert statuses[("k1", "distill")] == statuses[("k1", "naive")] == "ok"
    assert statuses[("nonsense", "distill")] == statuses[("nonsense", "naive")] == "error"
