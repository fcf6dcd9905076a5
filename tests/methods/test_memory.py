"""Peak memory at Qwen's real vocabulary (V = 151,936), measured in a fresh subprocess per step by
benchmarks/scale_memory.py: teacher scoring and one OPD step stay far below the [B, T, V] cost, and
so does one OPD step through the cross-family path (byte groups, vocabulary-mapped top-k)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_memory.py"
ROWS, TOKENS = 2, 1024
NAIVE_MB = ROWS * TOKENS * 151_936 * 4 * 2 / 2**20  # fp32 logits + log_softmax: 2,374 MB
BOUND_MB = 800  # measured 200-450 MB (one [220, V] block, the head's gradient, activations)


def _measure(real_shape: Any, tmp_path: Path, kinds: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, str(BENCH), "--lengths", str(TOKENS), "--batch", str(ROWS), "--kinds", kinds]
    cmd += ["--threads", "1", "--json", "--pair", str(real_shape.student), str(real_shape.teacher)]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "DISTILL_WORKSPACE": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["kind"] for r in results] == kinds.split(",")
    return results


def test_scoring_and_an_opd_step_stay_far_below_the_vocabulary_sized_cost(
    real_shape: Any, tmp_path: Path
) -> None:
    results = _measure(real_shape, tmp_path, "teacher_score,opd:token_reward_direct,opd:forward_kl_topk")
    for r in results:
        assert r["tokens"] == TOKENS and r["rows"] == ROWS
        assert 0 < r["added_mb"] < BOUND_MB < NAIVE_MB / 2, r


def test_a_cross_family_opd_step_stays_inside_the_same_bound(real_shape: Any, tmp_path: Path) -> None:
    """`method.cross_family=always` forces the byte-group path on the pair's one tokenizer: the
    alignment, the per-group targets on the batch grid and the mapped top-k add no vocabulary-sized
    tensor, so one step stays inside the same-family bound."""
    results = _measure(real_shape, tmp_path, "opd-xf:token_reward_direct,opd-xf:forward_kl_topk")
    for r in results:
        assert r["tokens"] == TOKENS and r["rows"] == ROWS
        assert 0 < r["added_mb"] < BOUND_MB < NAIVE_MB / 2, r
        # The cross path really supervised every token (one token a side, nothing masked).
        figures = r["figures"]
        assert figures["kl/aligned_share"] == 1.0 and figures["bridge/seam_failure_rate"] == 0.0, figures
        assert figures["bridge/supervised_share"] == 1.0, figures
