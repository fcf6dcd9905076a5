"""The real-shape zoo pair: Qwen's real vocabulary and Qwen3's real chat template end to end on CPU
(preflight with thinking on and off, an OPD step, a ROSE step, `<think>` handling, the bridge)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from distill.config import Sampling
from distill.engines.hf import HFEngine

pytestmark = pytest.mark.integration

THINK = 151_667  # `<think>` in Qwen3's vocabulary


def test_the_pair_has_the_real_shape(real_shape: Any) -> None:
    from transformers import AutoTokenizer

    engine = HFEngine.load(str(real_shape.student))
    assert engine.model.config.vocab_size == 151_936 and len(engine.tokenizer) == 151_669
    assert engine.model.get_output_embeddings().weight.shape[0] == 151_936
    assert engine.eos_ids == {151_645, 151_643}  # <|im_end|>, <|endoftext|>: Qwen3's own generation ends
    tok = AutoTokenizer.from_pretrained(real_shape.tokenizer)
    assert tok.convert_tokens_to_ids("<think>") == THINK
    off = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _run(args: list[str], workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from distill.cli.app import app

    monkeypatch.setenv("DISTILL_WORKSPACE", str(workspace))
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("thinking", ["true", "false"])
def test_preflight_through_the_real_template(
    thinking: str, real_shape: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = [f"student.name={real_shape.student}", f"teacher.name={real_shape.teacher}"]
    modes = [f"student.enable_thinking={thinking}", f"teacher.enable_thinking={thinking}"]
    result = _run(
        ["run", "--preflight", "--domain", "rlve", "--method", "opd", *pair, *modes], tmp_path, monkeypatch
    )
    assert result.exit_code == 0, result.output
    assert (
        "student and teacher prompts are identical" in result.output and "preflight passed" in result.output
    )
    assert "self-score: student as its own teacher: max |A_t| = 0.00e+00" in result.output
    other = "false" if thinking == "true" else "true"
    mixed = [f"student.enable_thinking={thinking}", f"teacher.enable_thinking={other}"]
    result = _run(
        ["run", "--preflight", "--domain", "rlve", "--method", "opd", *pair, *mixed], tmp_path, monkeypatch
    )
    assert result.exit_code == 2 and "thinking mode differs" in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("method", ["opd", "rose"])
def test_one_step_through_the_real_template(
    method: str, real_shape: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [
        "run",
        "--domain",
        "rlve",
        "--method",
        method,
        f"student.name={real_shape.student}",
        f"teacher.name={real_shape.teacher}",
        "student.enable_thinking=true",
        "teacher.enable_thinking=true",
        "optim.max_steps=1",
        "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=12",
        "eval.items=2",
        "eval.max_new_tokens=6",
        "checkpoint.every_steps=0",
        f"tracking.run_name=qwen3-{method}",
    ]
    args += (
        ["method.loss=forward_kl_topk"]
        if method == "opd"
        else ["method.prefix_tokens=6", "method.teacher_max_tokens=6"]
    )
    result = _run(args, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / f"qwen3-{method}"
    assert json.loads((run / "summary.json").read_text())["status"] == "FINISHED"
    (step,) = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"train/loss"' in line
    ]
    assert step["step"] == 1 and step["train/loss"] == step["train/loss"]  # finite, not nan
    key = "kl/topk_overlap" if method == "opd" else "teacher/ce_target_share"
    assert key in step


def test_rose_teacher_continues_inside_the_students_think_block(real_shape: Any) -> None:
    """The real template with thinking off writes an empty think block after the assistant header;
    a student prefix that opened `<think>` gets a teacher prompt without it, and the teacher never
    opens a second one (the `<think>` token is suppressed in its continuation)."""
    from distill.tokenizer_bridge import thinking

    teacher = HFEngine.load(str(real_shape.teacher), enable_thinking=False)
    prompt = "Sort: 3 1 2"
    assert teacher.render(prompt).endswith("<think>\n\n</think>\n\n")
    ids = thinking.teacher_prompt_ids(teacher, prompt, "<think>\nFirst I")
    assert teacher.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert thinking.teacher_prompt_ids(teacher, prompt, "no think here") == teacher.prompt_ids(prompt)
    assert thinking.think_open_ids(teacher.tokenizer) == [THINK]
    prefix = teacher.encode("<think>\nFirst I")
    assert prefix[0] == THINK  # one markup token, not spelled out
    (held,) = teacher.generate([ids + prefix], Sampling(24, 1.0), suppress_tokens=[THINK])
    assert THINK not in held.ids and len(held.ids) > 0


def test_bridge_moves_qwen3_markup_by_content(real_shape: Any, tiny_zoo: Any) -> None:
    """Real Qwen3 keeps `<think>` as a non-special added token: the bridge still moves it as
    markup to the llama-style tokenizer's `<think>`, and ordinary text spelling "<think>" never
    becomes the markup token on the way back."""
    from transformers import AutoTokenizer

    from distill.tokenizer_bridge.bridge import TokenizerBridge, encode_plain

    qwen = AutoTokenizer.from_pretrained(real_shape.tokenizer)
    llama = AutoTokenizer.from_pretrained(tiny_zoo.tok_llama)
    bridge = TokenizerBridge(qwen, llama)
    student_ids = qwen("<think>\nLet me sort 3 1 2.</think>\n1 2 3", add_special_tokens=False)["input_ids"]
    assert THINK in student_ids
    out = bridge.to_teacher(student_ids)
    assert out.lossless and llama.convert_tokens_to_ids("<think>") in out.ids
    back = bridge.to_student(out.ids)
    assert back.lossless and back.ids == student_ids
    spelled = encode_plain(qwen, "a literal <think> in text")
    assert THINK not in spelled and qwen.decode(spelled) == "a literal <think> in text"
