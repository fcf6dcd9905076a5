"""Peak memory at Qwen's real vocabulary (V = 151,936), measured in a fresh subprocess per step by
benchmarks/scale_memory.py: teacher scoring and one OPD step stay far below the [B, T, V] cost."""

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


def test_scoring_and_an_opd_step_stay_far_below_the_vocabulary_sized_cost(
    real_shape: Any, tmp_path: Path
) -> None:
    kinds = "teacher_score,opd:token_reward_direct,opd:forward_kl_topk"
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
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["kind"] for r in results] == kinds.split(",")
    for r in results:
        assert r["tokens"] == TOKENS and r["rows"] == ROWS
        assert 0 < r["added_mb"] < BOUND_MB < NAIVE_MB / 2, r
