"""Byte-offset alignment of two tokenizations of one text (cross-family OPD).

Hand-built byte-level BPE tokenizers with known merges give exact splits; the zoo's two trained
families give a real pair; a seeded random sweep checks the invariants on awkward strings.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from distill.tokenizer_bridge.align import (
    Alignment,
    Group,
    TokenSpan,
    align,
    align_tokens,
    aligned_share,
    alignment_metrics,
    byte_decoder,
    group_index,
    group_sums,
    group_sums_torch,
    place_advantages,
    place_advantages_torch,
    size_histogram,
    special_keys,
    token_byte_spans,
    token_bytes,
)
from distill.zoo.tokenizers import train_tokenizer

# --- hand-built tokenizers -------------------------------------------------------------------------


def _bl(data: bytes) -> str:
    """Bytes in the byte-level alphabet (GPT-2's bytes_to_unicode)."""
    to_char = {b: c for c, b in byte_decoder().items()}
    return "".join(to_char[b] for b in data)


def byte_bpe(
    merges: Sequence[tuple[bytes, bytes]] = (),
    specials: Sequence[str] = (),
    eos: str | None = None,
    bos: str | None = None,
) -> Any:
    """A byte-level BPE whose vocabulary is the 256 bytes plus exactly `merges` (no pre-splitting)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {_bl(bytes([b])): b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(_bl(a + b), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(_bl(a), _bl(b)) for a, b in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos)


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def split(tok: Any, text: str) -> list[bytes]:
    return token_bytes(tok, enc(tok, text))


def grouped(
    al: Alignment, sb: list[bytes], tb: list[bytes]
) -> list[tuple[tuple[bytes, ...], tuple[bytes, ...]]]:
    return [(tuple(sb[g.s0 : g.s1]), tuple(tb[g.t0 : g.t1])) for g in al.groups]


def check_invariants(
    al: Alignment, student: Any, s_ids: list[int], teacher: Any, t_ids: list[int], text: str
) -> None:
    """Groups partition both sequences in order, cover the same bytes, minimally, and read as `text`."""
    data = text.encode()
    sb, tb = token_bytes(student, s_ids), token_bytes(teacher, t_ids)
    assert b"".join(sb) == data and b"".join(tb) == data
    s_pos = t_pos = 0
    for g in al.groups:
        assert (g.s0, g.t0) == (s_pos, t_pos) and g.s1 >= g.s0 and g.t1 >= g.t0, g
        s_pos, t_pos = g.s1, g.t1
        s_bytes, t_bytes = b"".join(sb[g.s0 : g.s1]), b"".join(tb[g.t0 : g.t1])
        assert s_bytes == t_bytes == data[g.start : g.end], (g, s_bytes, t_bytes)
        if g.special is None:  # minimal: no common boundary strictly inside the group
            s_cuts = {g.start + len(b"".join(sb[g.s0 : k])) for k in range(g.s0 + 1, g.s1)}
            t_cuts = {g.start + len(b"".join(tb[g.t0 : k])) for k in range(g.t0 + 1, g.t1)}
            assert not {c for c in s_cuts & t_cuts if g.start < c < g.end}, g
            assert g.matched, g
        # Where a group starts and ends on character boundaries, its tokens decode to its text.
        try:
            piece = data[g.start : g.end].decode()
            data[: g.start].decode()
        except UnicodeDecodeError:
            continue
        for tok, ids in ((student, s_ids[g.s0 : g.s1]), (teacher, t_ids[g.t0 : g.t1])):
            # (A Metaspace decoder drops the space of a group's first token: byte-level only.)
            if type(tok.backend_tokenizer.decoder).__name__ == "ByteLevel":
                assert tok.decode(ids, skip_special_tokens=True) == piece, (g, piece)
    assert (s_pos, t_pos) == (len(s_ids), len(t_ids))
    assert b"".join(data[g.start : g.end] for g in al.groups) == data
    assert student.decode(s_ids, skip_special_tokens=True) == text


# --- splits of the hand-built pairs ----------------------------------------------------------------

E_ACUTE, HAN, SMILE = "é".encode(), "中".encode(), "🙂".encode()


def test_multibyte_character_split_on_one_side() -> None:
    whole = byte_bpe([(E_ACUTE[:1], E_ACUTE[1:]), (HAN[:1], HAN[1:2]), (HAN[:2], HAN[2:])])
    bytewise = byte_bpe()
    for char in ("é", "中"):
        text = f"a{char}b"
        assert split(whole, text) == [b"a", char.encode(), b"b"]
        assert split(bytewise, text) == [b"a", *(bytes([c]) for c in char.encode()), b"b"]
        al = align_tokens(whole, enc(whole, text), bytewise, enc(bytewise, text))
        assert grouped(al, split(whole, text), split(bytewise, text)) == [
            ((b"a",), (b"a",)),
            ((char.encode(),), tuple(bytes([c]) for c in char.encode())),
            ((b"b",), (b"b",)),
        ]
        check_invariants(al, whole, enc(whole, text), bytewise, enc(bytewise, text), text)


def test_token_covering_bytes_of_two_characters() -> None:
    student = byte_bpe([(E_ACUTE[:1], E_ACUTE[1:])])  # é | x
    teacher = byte_bpe([(E_ACUTE[1:], b"x")])  # \xc3 | \xa9x: a token across the character boundary
    text = "éx"
    assert split(teacher, text) == [b"\xc3", b"\xa9x"]
    spans = token_byte_spans(teacher, enc(teacher, text))
    assert spans == [TokenSpan(0, 1), TokenSpan(1, 3)]
    al = align_tokens(student, enc(student, text), teacher, enc(teacher, text))
    assert [(g.s0, g.s1, g.t0, g.t1, g.start, g.end) for g in al.groups] == [(0, 2, 0, 2, 0, 3)]


def test_digits_grouped_differently() -> None:
    single = byte_bpe()
    triple = byte_bpe([(b"1", b"2"), (b"12", b"3"), (b"4", b"5")])
    text = "12345"
    assert split(triple, text) == [b"123", b"45"]
    al = align_tokens(single, enc(single, text), triple, enc(triple, text))
    assert grouped(al, split(single, text), split(triple, text)) == [
        ((b"1", b"2", b"3"), (b"123",)),
        ((b"4", b"5"), (b"45",)),
    ]
    assert aligned_share(al.groups) == pytest.approx(2 / 5)
    assert size_histogram(al.groups) == {(3, 1): 1, (2, 1): 1}


def test_whitespace_runs_merged_differently() -> None:
    student = byte_bpe([(b" ", b" ")])
    teacher = byte_bpe([(b"a", b" ")])
    text = "a    b"
    assert split(student, text) == [b"a", b"  ", b"  ", b"b"]
    assert split(teacher, text) == [b"a ", b" ", b" ", b" ", b"b"]
    al = align_tokens(student, enc(student, text), teacher, enc(teacher, text))
    assert grouped(al, split(student, text), split(teacher, text)) == [
        ((b"a", b"  "), (b"a ", b" ")),
        ((b"  ",), (b" ", b" ")),
        ((b"b",), (b"b",)),
    ]
    check_invariants(al, student, enc(student, text), teacher, enc(teacher, text), text)


def test_emoji_in_byte_tokens_on_one_side() -> None:
    bytewise = byte_bpe()
    whole = byte_bpe([(SMILE[:1], SMILE[1:2]), (SMILE[:2], SMILE[2:3]), (SMILE[:3], SMILE[3:])])
    text = "hi🙂!"
    assert len(split(bytewise, text)) == 7 and split(whole, text) == [b"h", b"i", SMILE, b"!"]
    al = align_tokens(bytewise, enc(bytewise, text), whole, enc(whole, text))
    assert [(g.student_len, g.teacher_len) for g in al.groups] == [(1, 1), (1, 1), (4, 1), (1, 1)]
    assert al.groups[2].start == 2 and al.groups[2].end == 6
    check_invariants(al, bytewise, enc(bytewise, text), whole, enc(whole, text), text)


def test_identical_tokenizations_are_one_to_one() -> None:
    tok = byte_bpe([(b"1", b"2"), (b" ", b" "), (E_ACUTE[:1], E_ACUTE[1:])])
    text = "12 café  🙂 中 12"
    ids = enc(tok, text) + [tok.convert_tokens_to_ids("ÿ")]  # and a byte-level partial char at the end
    al = align_tokens(tok, ids, tok, ids)
    assert len(al.groups) == len(ids)
    assert all((g.s0, g.s1, g.t0, g.t1) == (k, k + 1, k, k + 1) for k, g in enumerate(al.groups))
    assert aligned_share(al.groups, max_tokens=1) == 1.0 and not al.unmatched


# --- special tokens --------------------------------------------------------------------------------

STUDENT_SPECIALS = dict(specials=["<|im_end|>", "<think>", "</think>"], eos="<|im_end|>")
TEACHER_SPECIALS = dict(
    specials=["<|eot_id|>", "<|begin_of_text|>", "<think>"], eos="<|eot_id|>", bos="<|begin_of_text|>"
)


def test_eos_is_matched_by_role_as_its_own_group() -> None:
    student, teacher = byte_bpe(**STUDENT_SPECIALS), byte_bpe(**TEACHER_SPECIALS)  # type: ignore[arg-type]
    assert special_keys(student)[student.eos_token_id] == "eos" == special_keys(teacher)[teacher.eos_token_id]
    s_ids, t_ids = enc(student, "ok") + [student.eos_token_id], enc(teacher, "ok") + [teacher.eos_token_id]
    spans = token_byte_spans(student, s_ids)
    assert spans[-1] == TokenSpan(2, 2, "eos")
    al = align_tokens(student, s_ids, teacher, t_ids)
    assert al.groups[-1] == Group(2, 3, 2, 3, 2, 2, "eos") and al.groups[-1].matched
    assert not al.unmatched
    check_invariants(al, student, s_ids, teacher, t_ids, "ok")


def test_special_without_counterpart_is_reported() -> None:
    student, teacher = byte_bpe(**STUDENT_SPECIALS), byte_bpe(**TEACHER_SPECIALS)  # type: ignore[arg-type]
    think, close = student.convert_tokens_to_ids("<think>"), student.convert_tokens_to_ids("</think>")
    s_ids = [think, *enc(student, "hm"), close, *enc(student, "ok"), student.eos_token_id]
    t_ids = [teacher.bos_token_id, teacher.convert_tokens_to_ids("<think>"), *enc(teacher, "hmok")]
    t_ids.append(teacher.eos_token_id)
    al = align_tokens(student, s_ids, teacher, t_ids)
    # <think> matches by content (after the teacher's unmatched bos), </think> has no counterpart.
    assert al.unmatched == [("teacher", 0, "bos"), ("student", 3, "</think>")]
    kinds = [(g.special, g.student_len, g.teacher_len) for g in al.groups]
    assert kinds == [
        ("bos", 0, 1),
        ("<think>", 1, 1),
        (None, 1, 1),
        (None, 1, 1),
        ("</think>", 1, 0),
        (None, 1, 1),
        (None, 1, 1),
        ("eos", 1, 1),
    ]
    check_invariants(al, student, s_ids, teacher, t_ids, "hmok")
    assert alignment_metrics(al.groups)["kl/unmatched_groups"] == 2


def test_special_inside_a_teacher_token_stays_in_its_group() -> None:
    student = byte_bpe(**STUDENT_SPECIALS)  # type: ignore[arg-type]
    teacher = byte_bpe([(b"a", b"b")], **TEACHER_SPECIALS)  # type: ignore[arg-type]
    s_ids = [*enc(student, "a"), student.convert_tokens_to_ids("<think>"), *enc(student, "b")]
    al = align_tokens(student, s_ids, teacher, enc(teacher, "ab"))
    assert [(g.s0, g.s1, g.t0, g.t1) for g in al.groups] == [(0, 3, 0, 1)]
    assert al.unmatched == [("student", 1, "<think>")]


def test_spans_that_cover_different_texts_raise() -> None:
    with pytest.raises(ValueError, match="student tokens cover 3 bytes, teacher tokens 4"):
        align([(0, 1), (1, 3)], [(0, 4)])
    with pytest.raises(ValueError, match="contiguous"):
        align([(0, 1), (2, 3)], [(0, 3)])
    tok = byte_bpe()
    with pytest.raises(ValueError, match="differ at byte 2"):
        align_tokens(tok, enc(tok, "abc"), tok, enc(tok, "abd"))


def test_plain_span_lists() -> None:
    al = align([(0, 1), (1, 3), (3, 3), (3, 4)], [(0, 2), (2, 3), (3, 4)])
    # The zero-width ordinary token joins the group before it.
    assert [(g.s0, g.s1, g.t0, g.t1) for g in al.groups] == [(0, 3, 0, 2), (3, 4, 2, 3)]
    assert align([], []).groups == []


# --- sums and advantages ---------------------------------------------------------------------------


def test_group_sums_and_advantage_placement() -> None:
    al = align([(0, 1), (1, 2), (2, 3), (3, 5)], [(0, 3), (3, 4), (4, 5)])
    groups = al.groups
    assert [(g.student_len, g.teacher_len) for g in groups] == [(3, 1), (1, 2)]
    assert group_index(groups, "student") == [0, 0, 0, 1] and group_index(groups, "teacher") == [0, 1, 1]
    assert group_sums([-1.0, -2.0, -3.0, -4.0], groups, "student") == [-6.0, -4.0]
    assert group_sums([-0.5, -1.0, -2.0], groups, "teacher") == [-0.5, -3.0]
    assert place_advantages([2.0, -1.0], groups) == [2.0, 2.0, 2.0, -1.0]
    assert place_advantages([2.0, -1.0], groups, mode="last") == [0.0, 0.0, 2.0, -1.0]
    # The gradient of sum_g A_g * logp_S(g) w.r.t. the per-token logprobs is the spread placement.
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    sums = group_sums_torch(logp, groups, "student")
    assert sums.tolist() == [[-6.0, -4.0]]
    adv = torch.tensor([[2.0, -1.0]])
    (adv * sums).sum().backward()
    assert logp.grad is not None
    assert torch.equal(logp.grad, place_advantages_torch(adv, groups))
    assert place_advantages_torch(adv, groups, mode="last").tolist() == [[0.0, 0.0, 2.0, -1.0]]
    with pytest.raises(ValueError, match="tokens"):
        group_sums_torch(torch.zeros(3), groups, "student")


# --- the zoo's two trained families ----------------------------------------------------------------

CORPUS = [
    "What is 12345 times 678? 12345 678 999 1000 2024",
    "You are given the following list of numbers:\n7 4 11\nPlease sort them in **ascending order**.",
    "smallest 4, left 7 11.\nsmallest 7, left 11.\nsmallest 11, left none.\n\\boxed{4 7 11}",
    "7 * 9: 9, 18, 27, 36, 45, 54, 63.\n\\boxed{63}",
] * 20

TEXTS = [
    "What is 12345 times 678?",
    "digits 0 7 12 345 6789 1234567890 3.14159 -42 1e-5 007",
    "a    b\t\tc\n\n\n  d \r\n",
    "    leading and trailing    ",
    "naïve café — 世界, Ελληνικά, עברית",
    "🙂 👩\u200d👩\u200d👧 e\u0301 ﬁ ①",
    "中文字符 12 个",
    "smallest 4, left 7 11.\n\\boxed{4 7 11}",
    "Please sort them in **ascending order**.",
    "x = (a + b) * c / d - e ^ f % g",
    "multiplication multiplies multiplicatively",
    "\\boxed{63}",
    "",
    " ",
    "\n",
    "1",
    "9999999",
    "Hello, World! Héllo wörld ñ ç ß",
    "🇫🇷🇯🇵 ∑∫∂√∞ ≤ ≥",
    "\u200b zero width \ufeff bom \x00\x7f",
    "7 * 9: 9, 18, 27, 36, 45, 54, 63.",
]


@pytest.fixture(scope="module")
def zoo() -> tuple[Any, Any]:
    return train_tokenizer("qwen", CORPUS, 400), train_tokenizer("llama", CORPUS, 450)


def test_zoo_pair_invariants(zoo: tuple[Any, Any]) -> None:
    qwen, llama = zoo
    shares = []
    for student, teacher in ((qwen, llama), (llama, qwen)):
        for text in TEXTS:
            s_ids = enc(student, text) + [student.eos_token_id]
            t_ids = enc(teacher, text) + [teacher.eos_token_id]
            al = align_tokens(student, s_ids, teacher, t_ids)
            check_invariants(al, student, s_ids, teacher, t_ids, text)
            assert al.groups[-1].special == "eos" and al.groups[-1].matched and not al.unmatched
            shares.append(aligned_share(al.groups))
    # Digits split differently (one vs up to three), so some groups are wider than 1:1.
    al = align_tokens(qwen, enc(qwen, "1234567"), llama, enc(llama, "1234567"))
    assert any(g.student_len > 1 for g in al.groups)
    assert 0.5 < sum(shares) / len(shares) <= 1.0


def test_zoo_same_family_reduces_to_one_to_one(zoo: tuple[Any, Any]) -> None:
    for tok in zoo:
        for text in TEXTS:
            ids = enc(tok, text) + [tok.eos_token_id]
            al = align_tokens(tok, ids, tok, ids)
            assert [(g.s0, g.t0) for g in al.groups] == [(k, k) for k in range(len(ids))]
            assert all(g.student_len == g.teacher_len == 1 for g in al.groups)


def test_zoo_non_canonical_student_tokens(zoo: tuple[Any, Any]) -> None:
    """A sampled sequence need not be the tokenizer's own split of its text: one byte per token."""
    qwen, llama = zoo
    text = "café 12345 🙂"
    s_ids = [qwen.convert_tokens_to_ids(_bl(bytes([b]))) for b in text.encode()]
    assert qwen.decode(s_ids) == text
    al = align_tokens(qwen, s_ids, llama, enc(llama, text))
    check_invariants(al, qwen, s_ids, llama, enc(llama, text), text)


def test_zoo_response_through_the_bridge(zoo: tuple[Any, Any]) -> None:
    """The OPD flow: the student's response crosses to the teacher (specials by role), then aligns."""
    from distill.tokenizer_bridge.bridge import TokenizerBridge

    qwen, llama = zoo
    bridge = TokenizerBridge(qwen, llama)
    think, close, im_start = (qwen.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<|im_start|>"))
    body, answer = "\nsmallest 3, left 5 9.\n", "\n\nThe answer is \\boxed{3 5 9} 中🙂"
    s_ids = [think, *enc(qwen, body), close, *enc(qwen, answer), qwen.eos_token_id]
    crossed = bridge.to_teacher(s_ids)
    assert crossed.lossless and crossed.ids[-1] == llama.eos_token_id
    al = align_tokens(qwen, s_ids, llama, crossed.ids)
    check_invariants(al, qwen, s_ids, llama, crossed.ids, body + answer)
    assert [g.special for g in al.groups if g.special] == ["<think>", "</think>", "eos"] and not al.unmatched
    # A student special the teacher has no counterpart for: dropped by the bridge, reported here.
    s_ids = [*enc(qwen, "hi"), im_start, *enc(qwen, "there"), qwen.eos_token_id]
    crossed = bridge.to_teacher(s_ids)
    assert crossed.dropped == ["<|im_start|>"]
    al = align_tokens(qwen, s_ids, llama, crossed.ids)
    assert al.unmatched == [("student", len(enc(qwen, "hi")), "<|im_start|>")]
    check_invariants(al, qwen, s_ids, llama, crossed.ids, "hithere")


FRAGMENTS = [
    "a", "b", "Z", "the", " ", "  ", "\t", "\n", "\r\n", "0", "7", "12", "345", "99999", ".", ",", "\\boxed{",
    "}", "é", "e\u0301", "ß", "中", "世界", "ñ", "Ω", "🙂", "👍🏽", "👩\u200d👧", "🇯🇵", "\u200b", "ﬁ", "①", "—",
]  # fmt: skip


def test_zoo_random_strings(zoo: tuple[Any, Any]) -> None:
    rng = random.Random(1234)
    qwen, llama = zoo
    for _ in range(300):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 24)))
        student, teacher = (qwen, llama) if rng.random() < 0.5 else (llama, qwen)
        s_ids, t_ids = enc(student, text), enc(teacher, text)
        if rng.random() < 0.5:
            s_ids, t_ids = s_ids + [student.eos_token_id], t_ids + [teacher.eos_token_id]
        al = align_tokens(student, s_ids, teacher, t_ids)
        check_invariants(al, student, s_ids, teacher, t_ids, text)
        assert not al.unmatched
        same = align_tokens(student, s_ids, student, s_ids)
        assert all(g.student_len == g.teacher_len == 1 for g in same.groups)


# --- tokenizers that are not byte-level ------------------------------------------------------------


def sentencepiece_like() -> Any:
    """Llama-2 style: "\u2581" for spaces, byte-fallback "<0xNN>" pieces, the leading space stripped."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "\u2581": 2, "a": 3, "b": 4, "\u2581a": 5, "é": 6}
    vocab.update({f"<0x{b:02X}>": 7 + b for b in range(256)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("\u2581", "a")], byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def test_sentencepiece_byte_fallback_pieces_get_their_bytes(zoo: tuple[Any, Any]) -> None:
    sp, (_, llama) = sentencepiece_like(), zoo
    text = "a 🙂 b é"
    ids = enc(sp, text) + [sp.eos_token_id]
    assert sp.convert_ids_to_tokens(ids)[2:6] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert token_bytes(sp, ids) == [b"a", b" ", *(bytes([b]) for b in SMILE), b" ", b"b", b" ", E_ACUTE, b""]
    same = align_tokens(sp, ids, sp, ids)  # the same-family reduction holds here too
    assert all(g.student_len == g.teacher_len == 1 for g in same.groups)
    t_ids = enc(llama, text) + [llama.eos_token_id]
    al = align_tokens(sp, ids, llama, t_ids)
    check_invariants(al, sp, ids, llama, t_ids, text)
    assert al.groups[-1].special == "eos" and not al.unmatched


def test_metaspace_tokenizer(zoo: tuple[Any, Any]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    corpus = ["the cat sat on the mat", "café au lait 12 34", "über straße"] * 10
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "</s>"]))
    hf: Any = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="[UNK]")
    bytewise, (_, llama) = byte_bpe(), zoo
    for text in ("the cat sat", "café au lait", "über straße 12"):
        ids = enc(hf, text) + [hf.eos_token_id]
        assert hf.decode(ids, skip_special_tokens=True) == text
        t_ids = enc(llama, text) + [llama.eos_token_id]
        check_invariants(align_tokens(hf, ids, llama, t_ids), hf, ids, llama, t_ids, text)
        # Not the tokenizer's own split: one piece per character.
        chars = [hf.convert_tokens_to_ids(c) for c in "\u2581" + text.replace(" ", "\u2581")]
        assert hf.decode(chars) == text
        al = align_tokens(hf, chars, bytewise, enc(bytewise, text))
        check_invariants(al, hf, chars, bytewise, enc(bytewise, text), text)


def test_offsets_and_prefix_fallback_for_a_word_level_tokenizer() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: k for k, w in enumerate(["[UNK]", "</s>", "the", "café", "sat", "x.y", "x", ".", "y"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf: Any = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="[UNK]")
    bytewise = byte_bpe()
    text = "the café sat"  # decodes with a space between words
    ids = enc(hf, text) + [hf.eos_token_id]
    assert hf.decode(ids, skip_special_tokens=True) == text
    # Offsets: the space between two words joins the word after it.
    assert token_bytes(hf, ids) == [b"the", " café".encode(), b" sat", b""]
    al = align_tokens(hf, ids[:-1], bytewise, enc(bytewise, text))
    assert [(g.student_len, g.teacher_len) for g in al.groups] == [(1, 3), (1, 6), (1, 4)]
    # Ids the tokenizer would not produce from their text ("x.y" re-encodes as x . y): the prefix
    # each token prefix decodes to places them.
    odd = [vocab[w] for w in ("café", "x.y", "sat")]
    assert hf.decode(odd) == "café x.y sat" and enc(hf, "café x.y sat") != odd
    assert token_bytes(hf, odd) == ["café".encode(), b" x.y", b" sat"]
    al = align_tokens(hf, odd, bytewise, enc(bytewise, "café x.y sat"))
    assert [(g.student_len, g.teacher_len) for g in al.groups] == [(1, 5), (1, 4), (1, 4)]
