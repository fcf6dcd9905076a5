"""`distill bridge check` on the family matrix's cross-family pairs: lossless seams (a sentencepiece
teacher's read and written in place), the special-token map by meaning, and both sides' row counts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from distill.tokenizer_bridge.bridge import TokenizerBridge
from distill.tokenizer_bridge.seam import check_pair, hard_texts
from families.conftest import run_cli

pytestmark = pytest.mark.integration

TEXTS = ["You are given the following list of numbers:\n4 2 8\nPlease sort them.", "\\boxed{2 4 8}"]


@pytest.fixture(scope="module")
def qwen3(families: Any) -> Any:
    return AutoTokenizer.from_pretrained(families.tokenizers["qwen3"])


@pytest.mark.parametrize("teacher", ["gpt2", "llama3", "mistral"])
def test_each_cross_pair_round_trips(teacher: str, qwen3: Any, families: Any) -> None:
    other = AutoTokenizer.from_pretrained(families.tokenizers[teacher])
    for student, far in ((qwen3, other), (other, qwen3)):
        report = check_pair(student, far, TEXTS + hard_texts(student, far), cuts=8)
        assert report.ok, [(row.name, row.failures[:1]) for row in report.rows if not row.ok]
    bridge = TokenizerBridge(qwen3, other)
    # The student's end of turn always reaches the teacher's, and comes back as itself.
    end = bridge.to_teacher([qwen3.eos_token_id])
    assert end.lossless and bridge.to_student(end.ids).ids == [qwen3.eos_token_id]


def test_bridge_check_cli_on_the_eos_pad_pair(
    families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's pair: Qwen3 (151,936 rows) and GPT-2, whose `<|endoftext|>` is eos and pad."""
    args = ["bridge", "check", "--student", families["s-qwen3"], "--teacher", families["t-gpt2-chat"]]
    result = run_cli([*args, "--items", "2", "--cuts", "4"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    out = result.output
    assert "result: lossless" in out
    assert (
        "student: tokenizer 151,669 entries, embedding 151,936 rows (ids 151,669..151,935 have no text)"
        in out
    )
    assert "teacher: tokenizer 50,257 entries, embedding 50,257 rows (one row per entry)" in out
    assert "teacher -> student: <|endoftext|> (50256, end) -> <|im_end|> (151645)" in out
    assert "student -> teacher: <|im_end|> (151645, end) -> <|endoftext|> (50256)" in out


def test_bridge_check_cli_on_the_sentencepiece_pair(
    families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mistral's sentencepiece teacher: a run decoded alone loses its leading `▁` space and a text
    encoded alone gains a dummy one, so its seams cross read and written in place; the check says
    lossless and how many seams needed the anchor."""
    args = ["bridge", "check", "--student", families["s-qwen3"], "--teacher", families["t-mistral"]]
    result = run_cli([*args, "--items", "2", "--cuts", "6"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    assert "result: lossless" in result.output
    anchors = re.search(r"anchors: (\d+) of (\d+) seams", result.output)
    assert anchors is not None and 0 < int(anchors[1]) <= int(anchors[2]), result.output
    assert "teacher -> student: </s> (2, end) -> <|im_end|> (151645)" in result.output
