"""Moving token ids between two tokenizers through text, special tokens by name, never as text.

A sequence of ids is read as *pieces*: runs of ordinary tokens decoded to text, and special
tokens kept as their content (`<think>`, `<|im_end|>`). Text pieces are re-encoded by the other
tokenizer with its special-token matching off (a student that spelled "<think>" with ordinary
tokens did not open a think block); special pieces map to the other side's special token of the
same role (eos, pad, bos) or the same content, and are dropped and reported when it has none.
So a special token never leaks into the other side as literal text.

The bridge is lossless when the pieces on the far side equal the mapped pieces on the near side;
every conversion says whether it was, and `seam.py` checks it on whole corpora.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Specials are written into a flat string between private-use code points, which no tokenizer
# produces from ordinary text, so piece lists compare and prefix-test as plain strings.
_OPEN, _CLOSE = "\ue000", "\ue001"
_ROLES = ("eos_token", "pad_token", "bos_token")


@dataclass(frozen=True)
class Piece:
    text: str
    special: bool  # a special token's content, not text
    # A special token the far side has no counterpart for: kept in the near side's pieces so the
    # loss shows (and is named) wherever pieces are compared, never sent across.
    dropped: bool = False


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """id -> content of every token that is markup, not text: the tokenizer's special tokens and
    every other added token. Real Qwen3 adds `<think>`, `</think>` and its tool tokens as
    non-special added tokens (kept by skip_special_tokens), yet they are template markup: they
    cross the bridge by content, never spelled out as text."""
    out = {i: tok.content for i, tok in tokenizer.added_tokens_decoder.items()}
    for role in _ROLES:
        token = getattr(tokenizer, role, None)
        token_id = tokenizer.convert_tokens_to_ids(str(token)) if token else None
        if isinstance(token_id, int):
            out[token_id] = str(token)
    return out


def pieces(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], specials: dict[int, str] | None = None
) -> list[Piece]:
    """`ids` as merged text runs and special tokens, in order (`specials`: a cached special_tokens)."""
    specials = special_tokens(tokenizer) if specials is None else specials
    out: list[Piece] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            text = str(tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False))
            if out and not out[-1].special:
                out[-1] = Piece(out[-1].text + text, False)
            elif text:
                out.append(Piece(text, False))
            run.clear()

    for i in ids:
        if i in specials:
            flush()
            out.append(Piece(specials[i], True))
        else:
            run.append(int(i))
    flush()
    return out


def flat(parts: Sequence[Piece]) -> str:
    """Pieces as one comparable string: specials wrapped in private-use delimiters."""
    return "".join(f"{_OPEN}{p.text}{_CLOSE}" if p.special else p.text for p in parts)


def readable(parts: Sequence[Piece]) -> str:
    """Pieces as a human reads them: specials written as their content, dropped ones left out
    (the text that crossed)."""
    return "".join(p.text for p in parts if not p.dropped)


def shown(text: str) -> str:
    """Flat text (raw, or as `repr` wrote it into a seam report) for a person: specials as
    `⟨content⟩`, and the characters a terminal draws invisibly or like another one (combining
    marks, zero-width and format characters, unusual spaces, controls) as `\\uXXXX` escapes, so a
    dropped special, an NFC/NFD or a whitespace difference shows where expected and got differ."""
    import unicodedata

    for delimiter, mark in ((_OPEN, "⟨"), (_CLOSE, "⟩")):
        text = text.replace(delimiter, mark).replace(f"\\u{ord(delimiter):04x}", mark)
    out = []
    for ch in text:
        if ch in "\n\t\r":
            out.append(repr(ch)[1:-1])
        elif unicodedata.category(ch)[0] in "MCZ" and ch != " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def encode_plain(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ordinary text to ids, never matching a markup token inside it: a student that spelled
    "<think>" with ordinary tokens did not open a think block. Special tokens are split by the
    tokenizer itself; other added tokens (always matched by `tokenizers`) are encoded in two
    halves, which decode to the same text."""
    if not text:
        return []
    markup = sorted(
        {t.content for t in tokenizer.added_tokens_decoder.values() if not t.special and t.content},
        key=len,
        reverse=True,
    )
    parts = _split_markup(text, markup)
    ids: list[int] = []
    for part, is_markup in parts:
        chunks = [part[:1], part[1:]] if is_markup else [part]
        for chunk in chunks:
            if chunk:
                ids += tokenizer(chunk, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids


def _split_markup(text: str, markup: list[str]) -> list[tuple[str, bool]]:
    """`text` as (piece, is_markup) runs around the occurrences of `markup` strings."""
    if not markup:
        return [(text, False)]
    # Longest first, so `</think>` is matched whole rather than as a shorter string inside it.
    pattern = re.compile("(" + "|".join(re.escape(m) for m in markup) + ")")
    return [(part, i % 2 == 1) for i, part in enumerate(pattern.split(text)) if part]


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    return a is b or (a.get_vocab() == b.get_vocab() and special_tokens(a) == special_tokens(b))


@dataclass
class Bridged:
    """One conversion: the far side's ids and what happened on the way."""

    ids: list[int]
    source: list[Piece]  # the near side's pieces, specials renamed to the far side's
    dropped: list[str] = field(default_factory=list)  # specials with no counterpart
    lossless: bool = True

    @property
    def text(self) -> str:
        return readable(self.source)


class TokenizerBridge:
    """Student <-> teacher ids through text; `same` when one tokenizer serves both (bypass)."""

    def __init__(self, student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> None:
        self.student = student
        self.teacher = teacher
        self.same = same_tokenizer(student, teacher)
        self.student_specials = special_tokens(student)
        self.teacher_specials = special_tokens(teacher)
        self.to_teacher_map = _special_map(student, teacher)
        self.to_student_map = _special_map(teacher, student)

    def to_teacher(self, student_ids: Sequence[int]) -> Bridged:
        return self._convert(
            student_ids,
            (self.student, self.student_specials),
            (self.teacher, self.teacher_specials),
            self.to_teacher_map,
        )

    def to_student(self, teacher_ids: Sequence[int]) -> Bridged:
        return self._convert(
            teacher_ids,
            (self.teacher, self.teacher_specials),
            (self.student, self.student_specials),
            self.to_student_map,
        )

    def student_pieces(self, ids: Sequence[int]) -> list[Piece]:
        return pieces(self.student, ids, self.student_specials)

    def teacher_pieces(self, ids: Sequence[int]) -> list[Piece]:
        return pieces(self.teacher, ids, self.teacher_specials)

    @staticmethod
    def _convert(
        ids: Sequence[int],
        src: tuple[PreTrainedTokenizerBase, dict[int, str]],
        dst: tuple[PreTrainedTokenizerBase, dict[int, str]],
        mapping: dict[str, tuple[str, int]],
    ) -> Bridged:
        out: list[int] = []
        renamed: list[Piece] = []
        dropped: list[str] = []
        for piece in pieces(src[0], ids, src[1]):
            if piece.special:
                if piece.text not in mapping:
                    dropped.append(piece.text)
                    renamed.append(Piece(piece.text, True, dropped=True))
                    continue
                name, token_id = mapping[piece.text]
                out.append(token_id)
                renamed.append(Piece(name, True))
            else:
                out.extend(encode_plain(dst[0], piece.text))
                renamed.append(piece)
        lossless = flat(pieces(dst[0], out, dst[1])) == flat(renamed) and not dropped
        return Bridged(ids=out, source=renamed, dropped=dropped, lossless=lossless)


def _special_map(src: PreTrainedTokenizerBase, dst: PreTrainedTokenizerBase) -> dict[str, tuple[str, int]]:
    """src special content -> (dst content, dst id): by role (eos <-> eos), else by the same content."""
    dst_specials = {content: i for i, content in special_tokens(dst).items()}
    mapping: dict[str, tuple[str, int]] = {}
    for content in special_tokens(src).values():
        if content in dst_specials:
            mapping[content] = (content, dst_specials[content])
    for role in _ROLES:
        a, b = getattr(src, role, None), getattr(dst, role, None)
        if a and b:
            mapping[str(a)] = (str(b), dst_specials[str(b)])
    return mapping


def clean_cut(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], k: int) -> int:
    """The largest cut <= k whose text is a prefix of the whole text of `ids`.

    A byte-level token can end inside a multi-byte character: its text then ends in U+FFFD and
    would cross to the other tokenizer as a real replacement character. Cutting before it is
    lossless.
    """
    specials = special_tokens(tokenizer)
    whole = flat(pieces(tokenizer, ids, specials))
    while k > 0 and not whole.startswith(flat(pieces(tokenizer, ids[:k], specials))):
        k -= 1
    return k


def trim_partial(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> list[int]:
    """`ids` without trailing tokens that end inside a character (a continuation cut at its budget)."""
    specials = special_tokens(tokenizer)
    kept = list(ids)
    while kept and flat(pieces(tokenizer, kept, specials)).endswith("\ufffd"):
        kept.pop()
    return kept
