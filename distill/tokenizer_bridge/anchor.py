"""A run of tokens read and written where it stands in its sequence: decoding and encoding in context.

What a run of tokens reads as can depend on what precedes it. A sentencepiece model (Mistral,
Llama-2, Gemma) writes a word's leading space into the word's token (`▁Please`), and its decoder
strips the space at the very start of a sequence: `▁Please` alone reads `Please`, after `\\n` it
reads ` Please`. Its encoder adds a dummy `▁` before the first word of a text, so `2 8` encoded on
its own reads ` 2 8` once it follows `4 `. Cut anywhere else than the start of a response, a run
decoded or encoded alone gains or loses a space.

So runs are read as streaming detokenizers read them (vLLM's incremental detokenizer, TGI's): with
the few tokens before it as an anchor, keeping only the text after the anchor's own
(`decode_after`); and a text that continues other tokens is encoded after an anchor text whose
tokens are then dropped (`encode_after`). Every tokenizer takes this one path. The plain form
(alone) is tried first and kept whenever it reads back in place, so a byte-level BPE, whose tokens
concatenate, always keeps it: its results are exactly those of reading and writing runs alone.
An anchored form is used only where it reads back and the plain one does not (`Encoded.anchored`),
and a tokenizer that truly loses text (a lowercasing normalizer, characters outside a vocabulary
without byte fallback) reads back in no form: the bridge reports it lossy.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Tokens of the preceding run a decode is anchored on (vLLM's incremental detokenizer keeps 5).
ANCHOR_TOKENS = 5
# The most preceding tokens a decode reads: the anchor, moved back to a whole character's start.
ANCHOR_SPAN = ANCHOR_TOKENS + 4
# Texts a continuation is encoded after, their tokens then dropped: each ends in a different class
# of character, so for any text one of them meets it at a token boundary (checked, not assumed).
# A sentencepiece model has no merge across a newline (Mistral's is a byte-fallback piece).
ANCHOR_TEXTS = ("\n", ".", "a")
_REPLACEMENT = "\ufffd"


def unicode_form(tokenizer: PreTrainedTokenizerBase) -> Literal["NFC", "NFD", "NFKC", "NFKD"] | None:
    """The unicode normal form the tokenizer's normalizer puts text in (None: it keeps text as is)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    form = type(getattr(backend, "normalizer", None)).__name__
    return form if form in ("NFC", "NFD", "NFKC", "NFKD") else None  # type: ignore[return-value]


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """`ids` alone, specials written as their content, no clean-up of spaces."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))


def decode_in_place(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], before: Sequence[int] = ()
) -> tuple[str, bool]:
    """(the text of `ids` where they follow `before`, whether that differs from their text alone).

    The last `ANCHOR_TOKENS` of `before` (the same side's preceding ids) are decoded with `ids` and
    alone; the run's text is what the first adds. The anchor starts on a whole character (a byte
    fallback decoder reads a run of byte pieces as one group: started inside a character, the
    group would turn to U+FFFD whole). An anchor that ends inside a character, so that `ids`
    start inside it, leaves the run its text alone: it has no text of its own to cross.
    """
    alone = decode(tokenizer, ids)
    if not before or not ids:
        return alone, False
    before = [int(i) for i in before]
    start = max(0, len(before) - ANCHOR_TOKENS)
    head = decode(tokenizer, before[start:])
    for _ in range(4):  # a UTF-8 character has at most four bytes
        if start == 0 or not head.startswith(_REPLACEMENT):
            break
        start -= 1
        head = decode(tokenizer, before[start:])
    whole = decode(tokenizer, [*before[start:], *(int(i) for i in ids)])
    if not whole.startswith(head):
        return alone, False
    text = whole[len(head) :]
    return text, text != alone


def decode_after(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], before: Sequence[int] = ()) -> str:
    """The text of `ids` where they follow `before` (`decode_in_place`)."""
    return decode_in_place(tokenizer, ids, before)[0]


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    # Written after an anchor (or with the dummy prefix spelled out): alone, the text would not
    # have read back in place.
    anchored: bool = False


def encode_after(tokenizer: PreTrainedTokenizerBase, text: str, before: Sequence[int] = ()) -> Encoded:
    """Ordinary text to ids that read back as `text` where they follow `before` (the far side's
    preceding ids; none: the start of a response). The plain encoding first; else the text after
    each anchor text, the anchor's ids dropped; else the first that reads back in none of them
    (plain), and the caller's check reports the loss."""
    plain = encode_plain(tokenizer, text)
    if not text or _reads_back(tokenizer, plain, before, text):
        return Encoded(plain)
    for ids in _anchored(tokenizer, text):
        if _reads_back(tokenizer, ids, before, text):
            return Encoded(ids, anchored=True)
    return Encoded(plain)


def _anchored(tokenizer: PreTrainedTokenizerBase, text: str) -> Iterator[list[int]]:
    for anchor in ANCHOR_TEXTS:
        head = encode_plain(tokenizer, anchor)
        whole = encode_plain(tokenizer, anchor + text)
        if whole[: len(head)] == head:  # the anchor ends on a token boundary of the whole
            yield whole[len(head) :]
    # A sentencepiece model puts its dummy `▁` before every text; the fast conversion (Metaspace,
    # prepend_scheme "first") leaves it out of a text that already starts with a space, whose
    # first space the decoder then strips as if it were the dummy one. Written out, it reads back.
    yield encode_plain(tokenizer, " " + text)


def _reads_back(tokenizer: PreTrainedTokenizerBase, ids: list[int], before: Sequence[int], text: str) -> bool:
    got = decode_after(tokenizer, ids, before)
    if got == text:
        return True
    form = unicode_form(tokenizer)  # the normalizer's form of a text is the same text to it
    return form is not None and unicodedata.normalize(form, got) == unicodedata.normalize(form, text)


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
    ids: list[int] = []
    for part, is_markup in split_markup(text, markup):
        chunks = [part[:1], part[1:]] if is_markup else [part]
        for chunk in chunks:
            if chunk:
                ids += tokenizer(chunk, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids


def split_markup(text: str, markup: Sequence[str]) -> list[tuple[str, bool]]:
    """`text` as (piece, is_markup) runs around the occurrences of `markup` strings."""
    if not markup:
        return [(text, False)]
    # Longest first, so `</think>` is matched whole rather than as a shorter string inside it.
    ordered = sorted(markup, key=len, reverse=True)
    pattern = re.compile("(" + "|".join(re.escape(m) for m in ordered) + ")")
    return [(part, i % 2 == 1) for i, part in enumerate(pattern.split(text)) if part]


def text_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` with its markup (`<think>`, an eos) as the tokenizer writes it: its own encoding
    where that reads back, else each markup token by its id and the text between encoded in
    place after it. A sentencepiece model's fast conversion drops a space from a text that starts
    with spaces; the real model does not, and neither do these ids."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if _reads_back(tokenizer, ids, (), text):
        return ids
    vocab = {t.content: i for i, t in tokenizer.added_tokens_decoder.items() if t.content}
    out: list[int] = []
    for part, is_markup in split_markup(text, list(vocab)):
        out += [vocab[part]] if is_markup else encode_after(tokenizer, part, out).ids
    return out
