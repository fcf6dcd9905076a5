"""Special tokens cross by meaning, not by the order of their roles: an eos never becomes a pad.

GPT-2's real tokenizer (`<|endoftext|>` is its eos, bos and pad) against the locally trained
qwen family (eos `<|im_end|>`, pad `<|endoftext|>`), and a Llama-3-base-like tokenizer whose
eos is a bare `<|end_of_text|>` while its template ends turns with `<|eot_id|>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from distill.tokenizer_bridge.align import special_keys
from distill.tokenizer_bridge.bridge import (
    TokenizerBridge,
    end_of_turn,
    role_tokens,
    special_map_lines,
    special_roles,
)
from distill.tokenizer_bridge.seam import check_pair, hard_texts

GPT2_CHAT = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% if m['role'] == 'assistant' %}"
    "{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


@pytest.fixture(scope="module")
def qwen(tiny_zoo: Any) -> Any:
    return AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from distill.zoo.families import gpt2_tokenizer

    return gpt2_tokenizer(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def llama_base(tiny_zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tok-llama as Llama 3's base tokenizers are configured: eos is `<|end_of_text|>`, yet the
    (instruct) template closes each turn with `<|eot_id|>`."""
    out = Path(tmp_path_factory.mktemp("llama-base"))
    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_llama)
    tok.eos_token = "<|end_of_text|>"
    tok.save_pretrained(out)
    return AutoTokenizer.from_pretrained(out)


def test_eos_that_is_also_pad_maps_to_the_students_end_of_turn(qwen: Any, gpt2: Any) -> None:
    """The issue's case: a teacher whose eos is its pad ends the student's turn with the
    student's eos (<|im_end|>), never its pad (<|endoftext|>)."""
    assert gpt2.eos_token == gpt2.pad_token == "<|endoftext|>"
    bridge = TokenizerBridge(qwen, gpt2)
    end = gpt2.convert_tokens_to_ids("<|endoftext|>")
    back = bridge.to_student(gpt2("The answer is 3", add_special_tokens=False)["input_ids"] + [end])
    assert back.ids[-1] == qwen.eos_token_id == qwen.convert_tokens_to_ids("<|im_end|>")
    assert qwen.pad_token_id not in back.ids and back.lossless
    assert special_roles(gpt2) == {end: "end"}  # its strongest meaning, not the last role read
    # The student's end of turn goes to the teacher's one token for it.
    ids = qwen("done", add_special_tokens=False)["input_ids"] + [qwen.eos_token_id]
    assert bridge.to_teacher(ids).ids[-1] == end


def test_bridge_check_of_an_eos_pad_teacher_is_lossless(qwen: Any, gpt2: Any) -> None:
    for student, teacher in ((qwen, gpt2), (gpt2, qwen)):
        texts = ["Sort 3 1 2.", "naïve café 12345"] + hard_texts(student, teacher)
        report = check_pair(student, teacher, texts, cuts=8)
        assert report.ok, [(row.name, row.failures[:1]) for row in report.rows if not row.ok]
    # GPT-2 has no think markup: it is listed, not spelled out as text on the far side.
    assert {"<think>", "</think>"} <= set(check_pair(qwen, gpt2, ["x"]).unmapped)


def test_end_of_turn_wins_over_a_bare_eos(qwen: Any, llama_base: Any) -> None:
    """Where the template ends turns with another token than the eos, that token is the end of
    turn: the student's <|im_end|> becomes <|eot_id|>, not the bare <|end_of_text|>."""
    eot = llama_base.convert_tokens_to_ids("<|eot_id|>")
    assert end_of_turn(llama_base) == "<|eot_id|>" and llama_base.eos_token == "<|end_of_text|>"
    roles = role_tokens(llama_base)
    assert roles["end"] == ("<|eot_id|>", eot) and roles["eos"][0] == "<|end_of_text|>"
    bridge = TokenizerBridge(qwen, llama_base)
    ids = qwen("3 5 9", add_special_tokens=False)["input_ids"] + [qwen.eos_token_id]
    assert bridge.to_teacher(ids).ids[-1] == eot
    assert bridge.to_student([eot]).ids == [qwen.eos_token_id]
    # A bare eos is still an end, never the pad: the student's eos.
    assert bridge.to_student([llama_base.eos_token_id]).ids == [qwen.eos_token_id]
    # Alignment reads both ends as "eos", so they pair up at a common boundary.
    assert special_keys(llama_base)[eot] == "eos" == special_keys(qwen)[qwen.eos_token_id]


def test_a_template_without_special_end_falls_back_to_eos(gpt2: Any) -> None:
    gpt2.chat_template = GPT2_CHAT
    assert end_of_turn(gpt2) == "<|endoftext|>"
    gpt2.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    assert end_of_turn(gpt2) is None and role_tokens(gpt2)["end"] == ("<|endoftext|>", 50256)
    gpt2.chat_template = None
    assert end_of_turn(gpt2) is None


def test_the_map_is_shown_by_meaning(qwen: Any, gpt2: Any) -> None:
    lines = special_map_lines(TokenizerBridge(qwen, gpt2))
    assert f"student -> teacher: <|im_end|> ({qwen.eos_token_id}, end) -> <|endoftext|> (50256)" in lines
    assert f"teacher -> student: <|endoftext|> (50256, end) -> <|im_end|> ({qwen.eos_token_id})" in lines
