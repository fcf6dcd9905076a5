"""Seams read and written in place (anchor.py): a real sentencepiece model (Mistral's, byte fallback)
crosses losslessly, byte-level pairs take exactly the plain path, and tokenizers that truly lose
text still read lossy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from distill.tokenizer_bridge.anchor import (
    decode,
    decode_after,
    decode_in_place,
    encode_after,
    encode_plain,
    text_ids,
)
from distill.tokenizer_bridge.bridge import TokenizerBridge, clean_cut
from distill.tokenizer_bridge.seam import check_pair, cut_points, hard_texts

ISSUE = "You are given the following list of numbers:\n4 2 8\nPlease sort them in **ascending order**."
TEXTS = [
    ISSUE,
    "smallest 2, left 4 8.\nsmallest 4, left 8.\n\\boxed{2 4 8}",
    "naïve café — 世界 🙂 ①②③④⑤",
    "    leading spaces, a tab\tand  two  spaces   ",
]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from distill.zoo.families import mistral_tokenizer

    out = tmp_path_factory.mktemp("mistral")
    mistral_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def qwen(tiny_zoo: Any) -> Any:
    return AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)


def ids_of(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_a_run_after_the_prefix_keeps_its_leading_space(mistral: Any) -> None:
    """`▁2` after `4` reads ` 2`: alone its decoder strips the space as a dummy prefix."""
    ids = ids_of(mistral, "4 2 8\nPlease")
    k = mistral.convert_ids_to_tokens(ids).index("2") - 1  # the cut before `▁2`
    assert decode(mistral, ids[:k]) == "4"
    assert decode(mistral, ids[k:]) == "2 8\nPlease"  # alone: the space is lost
    assert decode_in_place(mistral, ids[k:], ids[:k]) == (" 2 8\nPlease", True)
    # Written after the prefix: no dummy `▁` before a text that does not start with a space.
    plain = encode_plain(mistral, "2 8")
    assert decode_after(mistral, plain, ids[:k]) == " 2 8"
    placed = encode_after(mistral, "2 8", ids_of(mistral, "4 "))
    assert placed.anchored and decode_after(mistral, placed.ids, ids_of(mistral, "4 ")) == "2 8"


def test_every_cut_reads_back_in_place(mistral: Any) -> None:
    """Prefix alone plus the rest in place is the whole text at every cut, including cuts whose
    five-token anchor would start inside a byte-fallback character (it starts on a whole one)."""
    for text in TEXTS:
        ids = text_ids(mistral, text)
        assert decode(mistral, ids) == text
        for k in range(len(ids) + 1):
            if "\ufffd" in decode(mistral, ids[:k]):
                continue  # a cut inside a character (moved back before it crosses)
            assert decode(mistral, ids[:k]) + decode_after(mistral, ids[k:], ids[:k]) == text, (text, k)


def test_text_that_starts_with_spaces_keeps_them(mistral: Any) -> None:
    """The fast conversion leaves the dummy prefix out of a text starting with a space, so its
    own encoding loses one; the ids the bridge writes (the prefix spelled out) do not."""
    text = "    leading"
    assert decode(mistral, ids_of(mistral, text)) == "   leading"
    written = encode_after(mistral, text)
    assert written.anchored and decode(mistral, written.ids) == text
    assert decode(mistral, text_ids(mistral, text + "</s>")) == text + "</s>"


@pytest.mark.parametrize("direction", ["qwen->mistral", "mistral->qwen"])
def test_sentencepiece_pair_crosses_every_seam(qwen: Any, mistral: Any, direction: str) -> None:
    student, teacher = (qwen, mistral) if direction == "qwen->mistral" else (mistral, qwen)
    report = check_pair(student, teacher, TEXTS + hard_texts(student, teacher), cuts=None)
    assert report.ok, [(row.name, row.failures[:1]) for row in report.rows if not row.ok]
    # Most seams needed the anchor: a cut before `▁word` on the sentencepiece side.
    assert report.seams > 250 and report.anchored > report.seams // 2


def test_byte_level_pairs_take_the_plain_path(qwen: Any, tiny_zoo: Any) -> None:
    """Byte-level tokens concatenate: every run reads as it does alone and every text is written
    as it is alone, so byte-level pairs give exactly the results of the bridge without anchors."""
    llama = AutoTokenizer.from_pretrained(tiny_zoo.tok_llama)
    for tok in (qwen, llama):
        for text in TEXTS:
            ids = ids_of(tok, text)
            for k in cut_points(len(ids), None):
                k = clean_cut(tok, ids, k)
                assert decode_in_place(tok, ids[k:], ids[:k]) == (decode(tok, ids[k:]), False)
                rest = text[len(decode(tok, ids[:k])) :]
                written = encode_after(tok, rest, ids[:k])
                assert written.ids == encode_plain(tok, rest) and not written.anchored
    report = check_pair(qwen, llama, TEXTS + hard_texts(qwen, llama), cuts=None)
    assert report.ok and report.anchored == 0
    end = TokenizerBridge(qwen, llama).to_teacher(ids_of(qwen, "4 2 8<|im_end|>"))
    assert end.lossless and not end.anchored


def _uncased_wordpiece() -> Any:
    """A BERT-uncased-style WordPiece: lowercases and strips accents (trained here, tiny)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    corpus = [ISSUE, "naive cafe sorted numbers smallest left boxed"] * 20
    tok.train_from_iterator(
        corpus, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]", "[SEP]"])
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[SEP]")


def _without_byte_fallback(mistral: Any, out: Path) -> Any:
    """Mistral's vocabulary with byte fallback off: characters outside it become `<unk>`."""
    from tokenizers import Tokenizer

    mistral.save_pretrained(out)
    data = json.loads((out / "tokenizer.json").read_text())
    data["model"]["byte_fallback"] = False
    tok = Tokenizer.from_str(json.dumps(data))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_tokenizers_that_lose_text_still_read_lossy(qwen: Any, mistral: Any, tmp_path: Path) -> None:
    for lossy, text in (
        (_uncased_wordpiece(), "Naïve Café"),
        (_without_byte_fallback(mistral, tmp_path / "no-fallback"), "sorted: 世界 ①"),
    ):
        report = check_pair(qwen, lossy, [text], cuts=4)
        assert not report.ok
        row = next(row for row in report.rows if row.name == "round trip (teacher)")
        assert row.failures[0].startswith(repr(text)), row.failures
