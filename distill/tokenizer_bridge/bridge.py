"""Moving token ids between two tokenizers through text, special tokens by name, never as text.

A sequence of ids is read as *pieces*: runs of ordinary tokens decoded to text, and special
tokens kept as their content (`<think>`, `<|im_end|>`). Text pieces are re-encoded by the other
tokenizer with its special-token matching off (a student that spelled "<think>" with ordinary
tokens did not open a think block); special pieces map to the other side's special token of the
same *meaning* (`special_roles`: end of turn, eos, bos, pad) or else the same content, and are
dropped and reported when it has none. So a special token never leaks into the other side as
literal text, and an end of turn stays an end of turn: a teacher whose eos is also its pad
(GPT-2's `<|endoftext|>`) ends the student's turn with the student's end-of-turn token, never its
pad.

A run that continues other tokens (a teacher's continuation after the student's prefix, text
after a special token) is read and written in place, after an anchor (anchor.py): what a
sentencepiece model's leading `▁` means depends on what comes before it.

The bridge is lossless when the pieces on the far side equal the mapped pieces on the near side;
every conversion says whether it was, and `seam.py` checks it on whole corpora.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from distill.tokenizer_bridge.anchor import ANCHOR_SPAN, decode_in_place, encode_after
from distill.tokenizer_bridge.anchor import encode_plain as encode_plain
from distill.tokenizer_bridge.anchor import unicode_form as unicode_form

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Specials are written into a flat string between private-use code points, which no tokenizer
# produces from ordinary text, so piece lists compare and prefix-test as plain strings.
_OPEN, _CLOSE = "\ue000", "\ue001"
_ROLES = ("eos_token", "pad_token", "bos_token")
# What a special token means, strongest first: a token with several meanings (GPT-2's
# `<|endoftext|>` is its eos, bos and pad) is read as the first it has, so eos beats pad.
MEANINGS = ("end", "eos", "bos", "pad")
# Where a meaning goes on the other side, in order: an end of turn to the other's end of turn,
# else its eos; a bare eos to its eos, else its end of turn. Never an eos to a pad.
_TARGETS = {"end": ("end", "eos"), "eos": ("eos", "end"), "bos": ("bos",), "pad": ("pad",)}
# Stand-ins for a message's content when a chat template is rendered to find its end of turn.
_USER_MARK, _ASSISTANT_MARK = "\ue010", "\ue011"
# tokenizer -> (its chat template, the end-of-turn token found in it).
_END_CACHE: WeakKeyDictionary[PreTrainedTokenizerBase, tuple[str, str | None]] = WeakKeyDictionary()


@dataclass(frozen=True)
class Piece:
    text: str
    special: bool  # a special token's content, not text
    # A special token the far side has no counterpart for: kept in the near side's pieces so the
    # loss shows (and is named) wherever pieces are compared, never sent across.
    dropped: bool = False
    # This text, read after the tokens before it, reads differently alone (anchor.py): a
    # sentencepiece `▁word` after a special token or the prefix keeps its space.
    anchored: bool = field(default=False, compare=False)


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


def end_of_turn(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The special token the chat template closes an assistant turn with (Qwen's `<|im_end|>`,
    Llama 3's `<|eot_id|>`, Mistral's `</s>`); None without a template or when its turns end
    in plain text. Read off one rendered user/assistant exchange, cached per template."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        return None
    cached = _END_CACHE.get(tokenizer)
    if cached is not None and cached[0] == template:
        return cached[1]
    found: str | None = None
    messages = [{"role": "user", "content": _USER_MARK}, {"role": "assistant", "content": _ASSISTANT_MARK}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses this exchange (roles, a system turn) tells nothing
        text = None
    if isinstance(text, str) and _ASSISTANT_MARK in text:
        after = text.split(_ASSISTANT_MARK, 1)[1].lstrip(" ")
        names = sorted(set(special_tokens(tokenizer).values()), key=len, reverse=True)
        found = next((name for name in names if name and after.startswith(name)), None)
    _END_CACHE[tokenizer] = (template, found)
    return found


def role_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[str, tuple[str, int]]:
    """meaning -> (content, id) of the tokenizer's token for it: `end` (the template's end of
    turn, else the eos), `eos`, `bos`, `pad`. One token may serve several meanings."""
    out: dict[str, tuple[str, int]] = {}
    for meaning, attr in (("eos", "eos_token"), ("bos", "bos_token"), ("pad", "pad_token")):
        token = getattr(tokenizer, attr, None)
        token_id = tokenizer.convert_tokens_to_ids(str(token)) if token else None
        # A token the vocabulary lacks converts to the unk id; GPT-2's unk is its eos, so compare back.
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == str(token):
            out[meaning] = (str(token), token_id)
    end = end_of_turn(tokenizer)
    end_id = tokenizer.convert_tokens_to_ids(end) if end else None
    if end and isinstance(end_id, int):
        out["end"] = (end, end_id)
    elif "eos" in out:
        out["end"] = out["eos"]
    return out


def special_roles(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """id -> the strongest meaning (`MEANINGS` order) of each special token that has one."""
    out: dict[int, str] = {}
    for meaning, (_, token_id) in sorted(
        role_tokens(tokenizer).items(), key=lambda kv: MEANINGS.index(kv[0])
    ):
        out.setdefault(token_id, meaning)
    return out


def pieces(
    tokenizer: PreTrainedTokenizerBase,
    ids: Sequence[int],
    specials: dict[int, str] | None = None,
    before: Sequence[int] = (),
) -> list[Piece]:
    """`ids` as merged text runs and special tokens, in order (`specials`: a cached special_tokens).
    Each run is read in place after the tokens before it (anchor.py): `before` (the same side's
    ids that precede `ids`, e.g. the student's prefix before a continuation) and, for a run after
    a special token, that token."""
    specials = special_tokens(tokenizer) if specials is None else specials
    before = before[-ANCHOR_SPAN:] if before else ()
    seq = [*before, *ids]
    offset = len(before)
    out: list[Piece] = []
    start = offset

    def flush(end: int) -> None:
        if end > start:
            text, anchored = decode_in_place(
                tokenizer, seq[start:end], seq[max(0, start - ANCHOR_SPAN) : start]
            )
            if out and not out[-1].special:
                out[-1] = Piece(out[-1].text + text, False, anchored=out[-1].anchored or anchored)
            elif text:
                out.append(Piece(text, False, anchored=anchored))

    for j in range(offset, len(seq)):
        if seq[j] in specials:
            flush(j)
            out.append(Piece(specials[seq[j]], True))
            start = j + 1
    flush(len(seq))
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


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    return a is b or (a.get_vocab() == b.get_vocab() and special_tokens(a) == special_tokens(b))


@dataclass
class Bridged:
    """One conversion: the far side's ids and what happened on the way."""

    ids: list[int]
    source: list[Piece]  # the near side's pieces, specials renamed to the far side's
    dropped: list[str] = field(default_factory=list)  # specials with no counterpart
    lossless: bool = True
    # A run was read or written after an anchor (anchor.py): alone, it would not have crossed as
    # the same text. With `lossless`, the anchor is what made this conversion lossless.
    anchored: bool = False

    @property
    def text(self) -> str:
        return readable(self.source)


# The ids a conversion continues (`TokenizerBridge.to_teacher(ids, after=...)`): the same sequence's
# ids before `ids` on the near side, and the far side's ids of that same text.
After = tuple[Sequence[int], Sequence[int]]


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
        # The unicode form text takes once either side's normalizer has read it (real Qwen3
        # composes NFC): an NFD `e\u0301` written by one side is the same text as `é` to the pair.
        self.form = unicode_form(student) or unicode_form(teacher)

    def canon(self, text: str) -> str:
        """`text` in the pair's unicode form: what "the same text" means across the seam."""
        return unicodedata.normalize(self.form, text) if self.form else text

    def to_teacher(self, student_ids: Sequence[int], after: After = ((), ())) -> Bridged:
        """The student's ids in the teacher's tokens. `after`: what they continue (the student's
        ids before them, the teacher's ids of that text); nothing: the start of a response."""
        return self._convert(
            student_ids,
            (self.student, self.student_specials),
            (self.teacher, self.teacher_specials),
            self.to_teacher_map,
            self.canon,
            after,
        )

    def to_student(self, teacher_ids: Sequence[int], after: After = ((), ())) -> Bridged:
        """The teacher's ids in the student's tokens; `after` as in `to_teacher`, sides swapped
        (a continuation: the teacher's prefix ids, then the student's)."""
        return self._convert(
            teacher_ids,
            (self.teacher, self.teacher_specials),
            (self.student, self.student_specials),
            self.to_student_map,
            self.canon,
            after,
        )

    def student_pieces(self, ids: Sequence[int], before: Sequence[int] = ()) -> list[Piece]:
        return pieces(self.student, ids, self.student_specials, before)

    def teacher_pieces(self, ids: Sequence[int], before: Sequence[int] = ()) -> list[Piece]:
        return pieces(self.teacher, ids, self.teacher_specials, before)

    @staticmethod
    def _convert(
        ids: Sequence[int],
        src: tuple[PreTrainedTokenizerBase, dict[int, str]],
        dst: tuple[PreTrainedTokenizerBase, dict[int, str]],
        mapping: dict[str, tuple[str, int]],
        canon: Callable[[str], str] = str,
        after: After = ((), ()),
    ) -> Bridged:
        near_before, far_before = after
        out: list[int] = []
        renamed: list[Piece] = []
        dropped: list[str] = []
        anchored = False
        for piece in pieces(src[0], ids, src[1], near_before):
            if piece.special:
                if piece.text not in mapping:
                    dropped.append(piece.text)
                    renamed.append(Piece(piece.text, True, dropped=True))
                    continue
                name, token_id = mapping[piece.text]
                out.append(token_id)
                renamed.append(Piece(name, True))
            else:
                # Written in place: after the far side's prefix and what this conversion wrote.
                encoded = encode_after(dst[0], piece.text, [*far_before[-ANCHOR_SPAN:], *out][-ANCHOR_SPAN:])
                out.extend(encoded.ids)
                anchored = anchored or piece.anchored or encoded.anchored
                renamed.append(piece)
        far = flat(pieces(dst[0], out, dst[1], far_before))
        lossless = canon(far) == canon(flat(renamed)) and not dropped
        return Bridged(ids=out, source=renamed, dropped=dropped, lossless=lossless, anchored=anchored)


def _special_map(src: PreTrainedTokenizerBase, dst: PreTrainedTokenizerBase) -> dict[str, tuple[str, int]]:
    """src special content -> (dst content, dst id): a token with a meaning (`special_roles`) to
    the other side's token of that meaning (`_TARGETS`), any other by the same content."""
    dst_specials = {content: i for i, content in special_tokens(dst).items()}
    dst_roles, dst_meant = role_tokens(dst), special_roles(dst)
    src_roles = special_roles(src)
    mapping: dict[str, tuple[str, int]] = {}
    for token_id, content in special_tokens(src).items():
        meaning = src_roles.get(token_id)
        target = next((dst_roles[m] for m in _TARGETS[meaning] if m in dst_roles), None) if meaning else None
        if target is not None:
            mapping[content] = target
        elif content in dst_specials and dst_specials[content] not in dst_meant:
            # The same content, where it means nothing there (a pad never becomes an eos).
            mapping[content] = (content, dst_specials[content])
    return mapping


def special_map_lines(bridge: TokenizerBridge) -> list[str]:
    """The special-token map a bridge uses, both ways, one line per token that has a meaning or
    a counterpart (`bridge check` and preflight print it)."""
    lines: list[str] = []
    for label, src, mapping in (
        ("student -> teacher", bridge.student, bridge.to_teacher_map),
        ("teacher -> student", bridge.teacher, bridge.to_student_map),
    ):
        roles = special_roles(src)
        for token_id, content in sorted(special_tokens(src).items()):
            meaning = roles.get(token_id)
            if meaning is None and content not in mapping:
                continue  # markup the other side lacks: listed with the unmapped specials
            where = f"{mapping[content][0]} ({mapping[content][1]})" if content in mapping else "dropped"
            lines.append(f"{label}: {content} ({token_id}, {meaning or 'by name'}) -> {where}")
    return lines


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
