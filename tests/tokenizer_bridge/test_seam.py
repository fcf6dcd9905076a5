"""A lossy tokenizer is caught: by check_pair and by `distill bridge check` (exit code 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenizers import normalizers
from transformers import AutoTokenizer

from distill.tokenizer_bridge.seam import check_pair, cut_points, hard_texts


@pytest.fixture(scope="module")
def broken(tiny_zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tok-llama with a lossy normaliser (NFKC + lowercase), saved like any tokenizer."""
    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_llama)
    tok.backend_tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    out = tmp_path_factory.mktemp("broken-tokenizer")
    tok.save_pretrained(out)
    return out


def test_cut_points() -> None:
    assert cut_points(3, None) == [0, 1, 2, 3]
    assert cut_points(3, 16) == [0, 1, 2, 3]
    spread = cut_points(100, 5)
    assert spread == [0, 25, 50, 75, 100]


def test_lossy_normaliser_fails_the_check(tiny_zoo: Any, broken: Path) -> None:
    qwen = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    report = check_pair(
        qwen, AutoTokenizer.from_pretrained(broken), hard_texts(qwen) + ["Sort THESE"], cuts=8
    )
    assert not report.ok
    failing = {row.name for row in report.rows if not row.ok}
    assert {"round trip (teacher)", "prefix -> teacher", "seam (student side)"} <= failing
    assert "round trip (student)" not in failing
    example = next(row for row in report.rows if row.name == "round trip (teacher)").failures[0]
    assert "expected" in example and "got" in example


def _bridge_check(student: Path, teacher: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "distill",
            "bridge",
            "check",
            "--student",
            str(student),
            "--teacher",
            str(teacher),
            "--items",
            "4",
            "--cuts",
            "6",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_cli_reports_lossless_pair_and_fails_lossy_one(tiny_zoo: Any, broken: Path) -> None:
    good = _bridge_check(tiny_zoo.tok_qwen, tiny_zoo.tok_llama)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "result: lossless" in good.stdout and "teacher/student ratio" in good.stdout
    bad = _bridge_check(tiny_zoo.tok_qwen, broken)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "LOSSY" in bad.stdout and "round trip (teacher)" in bad.stdout
    missing = _bridge_check(tiny_zoo.tok_qwen, broken / "nope")
    assert missing.returncode == 2 and "error:" in missing.stderr
