"""The two locally trained tokenizer families: lossless, distinct, with their own chat templates."""

from __future__ import annotations

import re
from typing import Any

import pytest

from distill.zoo.tokenizers import FAMILIES, train_tokenizer

CORPUS = [
    "What is 12345 times 678? 12345 678 999 1000 2024",
    "You are given the following list of numbers:\n7 4 11\nPlease sort them in **ascending order**.",
    "smallest 4, left 7 11.\nsmallest 7, left 11.\nsmallest 11, left none.\n\\boxed{4 7 11}",
    "7 * 9: 9, 18, 27, 36, 45, 54, 63.\n\\boxed{63}",
] * 20

# No hypothesis in this environment: a fixed list that covers the awkward cases.
TEXTS = [
    "",
    " ",
    "   ",
    "\t",
    "\t\tindented\twith tabs",
    "\n",
    "\n\n\n",
    "line one\nline two\r\nline three",
    "trailing spaces   ",
    "   leading spaces",
    "a  b   c    d",
    "12345",
    "0",
    "007 0.5 -3 1e-5 3,141,592",
    "12345678901234567890",
    "\\boxed{1 2 3}",
    "x = (a + b) * c / d - e ^ f % g",
    "Hello, World! Héllo wörld ñ ç ß",
    "e\u0301 a\u0300 o\u0302 n\u0303",  # combining accents (decomposed)
    "\u00e9 vs e\u0301",  # precomposed vs decomposed: must stay distinct
    "世界你好 中文字符 12 个",
    "日本語のテキスト カタカナ",
    "한국어 텍스트",
    "😀 🎉 👍🏽 👨‍👩‍👧‍👦",  # emoji, skin tone modifier, ZWJ sequence
    "🇫🇷🇯🇵",
    "Ελληνικά кириллица עברית العربية",
    "∑∫∂√∞ ≤ ≥ ≠ ±",
    "\u200b zero width \ufeff bom",
    "\x00\x01\x7f control",
    "mixed 世界 and 😀 with\ttabs\nand  spaces 123",
    "<think> not special here? </think>",
    "a" * 300,
]


@pytest.fixture(scope="module")
def toks() -> dict[str, Any]:
    return {
        "qwen": train_tokenizer("qwen", CORPUS, 400),
        "llama": train_tokenizer("llama", CORPUS, 450),
    }


@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_round_trip_is_lossless(toks: dict[str, Any], family: str) -> None:
    tok = toks[family]
    unk = tok.unk_token_id
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, (family, text)
        assert unk is None or unk not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text.replace("<think>", "").replace(
            "</think>", ""
        )


@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_round_trip_of_concatenations(toks: dict[str, Any], family: str) -> None:
    tok = toks[family]
    joined = "".join(TEXTS)
    assert tok.decode(tok.encode(joined, add_special_tokens=False)) == joined


@pytest.mark.parametrize("family", ["qwen", "llama"])
def test_special_tokens_are_single_ids(toks: dict[str, Any], family: str) -> None:
    tok = toks[family]
    ids = set()
    for special in FAMILIES[family].specials:
        encoded = tok.encode(special, add_special_tokens=False)
        assert len(encoded) == 1, (family, special, encoded)
        assert encoded[0] == tok.convert_tokens_to_ids(special)
        ids.add(encoded[0])
        # Inside text too: never split into pieces.
        assert encoded[0] in tok.encode(f"abc{special}def", add_special_tokens=False)
    assert len(ids) == len(FAMILIES[family].specials)
    assert tok.eos_token == FAMILIES[family].eos
    assert tok.pad_token == FAMILIES[family].pad
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.bos_token == FAMILIES[family].bos


def test_special_tokens_are_skipped_on_decode(toks: dict[str, Any]) -> None:
    tok = toks["qwen"]
    ids = tok.encode("<|im_start|>hi<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "hi"


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2 times 3?"}]


def test_chat_templates_render_specials(toks: dict[str, Any]) -> None:
    qwen = toks["qwen"].apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    llama = toks["llama"].apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert qwen != llama
    assert qwen == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 times 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert llama == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 times 3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert "<|im_start|>" not in llama and "<|start_header_id|>" not in qwen


def test_templates_tokenize_specials_to_single_ids(toks: dict[str, Any]) -> None:
    for family, markers in (
        ("qwen", ["<|im_start|>", "<|im_end|>"]),
        ("llama", ["<|start_header_id|>", "<|eot_id|>"]),
    ):
        tok = toks[family]
        text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        for marker in markers:
            assert ids.count(tok.convert_tokens_to_ids(marker)) == text.count(marker)
        assert tok.decode(ids) == text


def test_generation_prompt_and_thinking(toks: dict[str, Any]) -> None:
    qwen = toks["qwen"]
    no_gen = qwen.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert not no_gen.endswith("<|im_start|>assistant\n")
    off = qwen.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = qwen.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert "<think>" not in on


def test_vocabularies_differ(toks: dict[str, Any]) -> None:
    qwen, llama = toks["qwen"].get_vocab(), toks["llama"].get_vocab()
    assert qwen != llama
    assert "<|im_start|>" in qwen and "<|im_start|>" not in llama
    assert "<|eot_id|>" in llama and "<|eot_id|>" not in qwen
    assert len(toks["qwen"]) == 400
    assert len(toks["llama"]) <= 450
    # Same text, different ids.
    text = "What is 12345 times 678?"
    assert toks["qwen"].encode(text, add_special_tokens=False) != toks["llama"].encode(
        text, add_special_tokens=False
    )


def _pieces(tok: Any, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok.encode(text, add_special_tokens=False)]


def test_qwen_splits_digits(toks: dict[str, Any]) -> None:
    tok = toks["qwen"]
    assert _pieces(tok, "12345") == ["1", "2", "3", "4", "5"]
    for piece in _pieces(tok, "x 12345678 and 2024, 999."):
        assert len(re.findall(r"\d", piece)) <= 1, piece


def test_llama_groups_up_to_three_digits(toks: dict[str, Any]) -> None:
    tok = toks["llama"]
    # 12345 is frequent in the corpus: the BPE merged its groups.
    assert _pieces(tok, "12345") == ["123", "45"]
    for text in ("12345678901234567890", "x 2024 and 1000000"):
        pieces = _pieces(tok, text)
        assert "".join(pieces) == text
        assert all(len(re.findall(r"\d", p)) <= 3 for p in pieces), pieces
    # Groups are left-aligned threes: no token crosses a group boundary.
    digits = "1234567"
    starts, pos = [], 0
    for piece in _pieces(tok, digits):
        starts.append(pos)
        pos += len(piece)
    ends = [s + len(p) for s, p in zip(starts, _pieces(tok, digits), strict=True)]
    for s, e in zip(starts, ends, strict=True):
        assert s // 3 == (e - 1) // 3, (digits, _pieces(tok, digits))


def test_unknown_family() -> None:
    with pytest.raises((KeyError, ValueError), match="gpt"):
        train_tokenizer("gpt", ["x"], 300)


def test_training_is_deterministic(toks: dict[str, Any]) -> None:
    again = train_tokenizer("llama", CORPUS, 450)
    assert again.get_vocab() == toks["llama"].get_vocab()
