"""Aligning two tokenizations of the same text on byte offsets (cross-family OPD).

The student samples in its tokens; the teacher scores the same text in its own. Both token
sequences are mapped to byte spans of the text's UTF-8 bytes, and the byte offsets that are token
boundaries on both sides cut them into *groups*: a minimal run of student tokens and a minimal run
of teacher tokens covering the same bytes. A group's logprob on each side is the sum over its
tokens. Identical tokenizations give one token per group on each side, so the cross-family path
reduces exactly to same-family OPD.

    token_bytes(tok, ids)            the bytes of each token (b"" for a special token)
    token_byte_spans(tok, ids)       [start, end) of each token in the text's bytes, specials flagged
    align(s_spans, t_spans)          -> Alignment(groups, unmatched); raises if the texts differ
    align_tokens(s_tok, s_ids, t_tok, t_ids)   both of the above, with the bytes compared
    group_index / group_sums / group_sums_torch   per-token values summed per group
    aligned_share / size_histogram / alignment_metrics   the kl/aligned_share metric and group sizes
    place_advantages / place_advantages_torch   a per-group advantage back on the student's tokens

Special tokens, as in `bridge.py`, are never text: they take zero bytes and carry a *key*, their
meaning ("eos" for an end of turn or an eos, "bos", "pad") or else their content, so the
student's `<|im_end|>` and the teacher's `<|eot_id|>` both read "eos". Specials standing at the same common boundary are matched in order
by key, each matched pair a group of its own (zero bytes, one token a side). A special with no
counterpart is reported in `Alignment.unmatched`: at a common boundary it gets a one-sided group
(the other side's range is empty: mask it), and one that falls inside the other side's token
stays inside that content group, so groups always partition both sequences in order.

Advantage placement. The sampled-token policy-gradient loss is -(A * logp_S) summed over tokens.
A group's student logprob is the SUM of its tokens' logprobs, so the group-level objective
sum_g A_g * logp_S(g) has gradient sum_g A_g * sum_{i in g} grad logp_S(y_i): exactly A_g on every
student token of the group ("spread", the default and the right one). "last" puts A_g on the
group's last student token only: it drops the gradient of the group's other tokens, so it is not
the gradient of the group objective. Both equal same-family OPD when every group has one token.
Use A_g = logp_T(g) - logp_S(g) (detached) and 0 for one-sided groups.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING, Literal, NamedTuple

from distill.tokenizer_bridge.anchor import decode_after
from distill.tokenizer_bridge.bridge import special_roles, special_tokens

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

Side = Literal["student", "teacher"]
_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenSpan(NamedTuple):
    start: int
    end: int
    special: str | None = None  # a special token's key (its role, else its content); None for text


@dataclass(frozen=True)
class Group:
    s0: int  # student tokens [s0, s1)
    s1: int
    t0: int  # teacher tokens [t0, t1)
    t1: int
    start: int  # bytes [start, end) of the text
    end: int
    special: str | None = None  # the key, when the group is a special token (matched or not)

    @property
    def student_len(self) -> int:
        return self.s1 - self.s0

    @property
    def teacher_len(self) -> int:
        return self.t1 - self.t0

    @property
    def matched(self) -> bool:
        """Both sides have tokens (a one-sided group is an unmatched special)."""
        return self.s1 > self.s0 and self.t1 > self.t0


@dataclass
class Alignment:
    groups: list[Group]
    unmatched: list[tuple[Side, int, str]] = field(default_factory=list)  # (side, token index, key)


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: a byte-level token's character -> its byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]  # "!".."~", "¡".."¬", "®".."ÿ"
    rest = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(rest)}


def special_keys(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """id -> key of every special token: its meaning (bridge.special_roles: an end of turn and a
    bare eos both read "eos", then "bos", "pad"; a token with several reads as the strongest,
    so GPT-2's `<|endoftext|>` is "eos", never "pad"), else its content."""
    keys = dict(special_tokens(tokenizer))
    for token_id, meaning in special_roles(tokenizer).items():
        keys[token_id] = "eos" if meaning == "end" else meaning
    return keys


def _byte_level(token: str) -> bytes:
    """As tokenizers' ByteLevel decoder: each character's byte, or the raw UTF-8 of a token outside
    the byte alphabet (an added token such as "<think> ")."""
    alphabet, to_latin1 = _byte_alphabet()
    # str.translate and a set test run in C: a 151k vocabulary reads in a fraction of a second.
    return token.translate(to_latin1).encode("latin-1") if alphabet.issuperset(token) else token.encode()


@lru_cache(maxsize=1)
def _byte_alphabet() -> tuple[frozenset[str], dict[int, int]]:
    """The byte-level alphabet, and a translation table of its characters to the latin-1 code
    point of their byte."""
    table = byte_decoder()
    return frozenset(table), {ord(c): b for c, b in table.items()}


def _sentencepiece(token: str) -> bytes:
    """SentencePiece pieces: "<0xNN>" byte-fallback tokens are one byte, "\u2581" is a space."""
    m = _SP_BYTE.fullmatch(token)
    return bytes([int(m.group(1), 16)]) if m else token.replace("\u2581", " ").encode()


def _run_bytes(tokenizer: PreTrainedTokenizerBase, run: list[int], before: list[int]) -> list[bytes]:
    """Bytes of each token of a run of ordinary tokens; joined, they are the run's text where it
    follows `before` (anchor.py: after a special token a sentencepiece `▁word` keeps its space)."""
    text = decode_after(tokenizer, run, before)
    data = text.encode()
    tokens = [str(t) for t in tokenizer.convert_ids_to_tokens(run)]
    for read in (_byte_level, _sentencepiece):
        out = [read(t) for t in tokens]
        joined = b"".join(out)
        if joined.decode("utf-8", errors="replace") == text:
            return out
        if joined[:1] == b" " and joined[1:] == data:  # a decoder that strips the leading space
            k = next(i for i, b in enumerate(out) if b)
            out[k] = out[k][1:]
            return out
    # Else offsets of the fast tokenizer when it tokenizes the text to these ids, or the longest
    # prefix of the text each token prefix decodes to (O(n^2) decodes).
    cum = list(accumulate((len(ch.encode()) for ch in text), initial=0))  # char -> byte offset
    ends: list[int] = []
    enc = tokenizer(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    if list(enc["input_ids"]) == run:
        ends = [cum[min(end, len(text))] for _, end in enc["offset_mapping"]]
    else:
        for k in range(1, len(run) + 1):
            prefix = decode_after(tokenizer, run[:k], before)
            n = next((i for i, (a, b) in enumerate(zip(prefix, text, strict=False)) if a != b), None)
            ends.append(cum[min(len(prefix), len(text)) if n is None else n])
    if ends:
        ends[-1] = len(data)
    out, pos = [], 0
    for end in ends:  # contiguous: a gap joins the next token, an overlap leaves it zero-width
        end = max(pos, min(end, len(data)))
        out.append(data[pos:end])
        pos = end
    return out


def token_bytes(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], keys: dict[int, str] | None = None
) -> list[bytes]:
    """The UTF-8 bytes of each token of `ids` (b"" for a special token); joined, they are the text.

    Byte-level BPE tokens map through the byte alphabet and SentencePiece byte-fallback tokens are
    their byte, so a token that splits a multi-byte character gets part of its bytes; other
    tokenizers fall back to offsets (`_run_bytes`), where a token may get zero bytes.
    Runs of ordinary tokens between specials are read in place after the tokens before them, as
    `bridge.pieces` reads them.
    """
    keys = special_keys(tokenizer) if keys is None else keys
    ids = [int(i) for i in ids]
    out: list[bytes] = []
    run: list[int] = []
    for k, i in enumerate([*ids, None]):
        if i is None or i in keys:
            if run:
                out.extend(_run_bytes(tokenizer, run, ids[: k - len(run)]))
                run = []
            if i is not None:
                out.append(b"")
        else:
            run.append(i)
    return out


def token_byte_spans(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], keys: dict[int, str] | None = None
) -> list[TokenSpan]:
    """Byte [start, end) of each token in the text's UTF-8 bytes; specials zero-width with their key."""
    keys = special_keys(tokenizer) if keys is None else keys
    return _to_spans(ids, token_bytes(tokenizer, ids, keys), keys)


def _to_spans(ids: Sequence[int], data: list[bytes], keys: dict[int, str]) -> list[TokenSpan]:
    cuts = list(accumulate((len(b) for b in data), initial=0))
    return [TokenSpan(a, b, keys.get(int(i))) for i, a, b in zip(ids, cuts[:-1], cuts[1:], strict=True)]


SpanLike = TokenSpan | tuple[int, int]


def _spans(spans: Sequence[SpanLike], side: str) -> list[TokenSpan]:
    out = [s if isinstance(s, TokenSpan) else TokenSpan(int(s[0]), int(s[1])) for s in spans]
    pos = 0
    for k, span in enumerate(out):
        if span.start != pos or span.end < span.start or (span.special is not None and span.end != pos):
            raise ValueError(
                f"{side} spans must be contiguous from byte 0 (specials zero-width): token {k} is {span}"
            )
        pos = span.end
    return out


def align(student: Sequence[SpanLike], teacher: Sequence[SpanLike]) -> Alignment:
    """Groups of student and teacher tokens between the byte offsets that are boundaries on both sides.

    Spans are `TokenSpan`s (or plain (start, end) pairs: no specials). An ordinary zero-width token
    (the offsets fallback gives one to a token whose offsets overlap the previous token's) joins
    the group before it. Raises ValueError when the spans cover different lengths (the texts differ).
    """
    S, T = _spans(student, "student"), _spans(teacher, "teacher")
    total_s, total_t = (S[-1].end if S else 0), (T[-1].end if T else 0)
    if total_s != total_t:
        raise ValueError(f"student tokens cover {total_s} bytes, teacher tokens {total_t}: the texts differ")
    out = Alignment([])
    i = j = pos = 0
    while i < len(S) or j < len(T):
        i2 = next((k for k in range(i, len(S)) if S[k].special is None), len(S))
        j2 = next((k for k in range(j, len(T)) if T[k].special is None), len(T))
        if i2 > i or j2 > j:  # specials at a common boundary: matched by key, in order
            for kind, a, b in _match([s.special or "" for s in S[i:i2]], [t.special or "" for t in T[j:j2]]):
                s0, t0 = i + a, j + b
                s1, t1 = s0 + (kind != "teacher"), t0 + (kind != "student")
                key = str(S[s0].special if kind != "teacher" else T[t0].special)
                out.groups.append(Group(s0, s1, t0, t1, pos, pos, key))
                if kind != "both":
                    out.unmatched.append((kind, s0 if kind == "student" else t0, key))
            i, j = i2, j2
            continue
        s1, t1, s_end, t_end = i, j, pos, pos
        while not (s_end == t_end > pos):  # one token at a time on the side that is behind
            if s_end <= t_end and s1 < len(S) and (S[s1].special is None or s_end < t_end):
                if S[s1].special is not None:  # inside a teacher token
                    out.unmatched.append(("student", s1, S[s1].special or ""))
                s_end, s1 = S[s1].end, s1 + 1
            elif t_end <= s_end and t1 < len(T) and (T[t1].special is None or t_end < s_end):
                if T[t1].special is not None:
                    out.unmatched.append(("teacher", t1, T[t1].special or ""))
                t_end, t1 = T[t1].end, t1 + 1
            else:
                break
        while s1 < len(S) and S[s1].special is None and S[s1].end == s_end:  # zero-width: join this group
            s1 += 1
        while t1 < len(T) and T[t1].special is None and T[t1].end == t_end:
            t1 += 1
        out.groups.append(Group(i, s1, j, t1, pos, s_end))
        i, j, pos = s1, t1, s_end
    return out


def _match(a: list[str], b: list[str]) -> list[tuple[Side | Literal["both"], int, int]]:
    """Two runs of special keys in order: ("both", ia, ib) for a matched pair, else one-sided."""
    out: list[tuple[Side | Literal["both"], int, int]] = []
    ib = 0
    for ia, key in enumerate(a):
        k = next((x for x in range(ib, len(b)) if b[x] == key), None)
        if k is None:
            out.append(("student", ia, ib))
            continue
        out.extend(("teacher", ia, x) for x in range(ib, k))
        out.append(("both", ia, k))
        ib = k + 1
    out.extend(("teacher", len(a), x) for x in range(ib, len(b)))
    return out


def align_tokens(
    student: PreTrainedTokenizerBase,
    student_ids: Sequence[int],
    teacher: PreTrainedTokenizerBase,
    teacher_ids: Sequence[int],
) -> Alignment:
    """Align two tokenizations of one text; ValueError (with where they part) if the bytes differ."""
    s_keys, t_keys = special_keys(student), special_keys(teacher)
    sb, tb = token_bytes(student, student_ids, s_keys), token_bytes(teacher, teacher_ids, t_keys)
    s_text, t_text = b"".join(sb), b"".join(tb)
    if s_text != t_text:
        k = next((x for x, (p, q) in enumerate(zip(s_text, t_text, strict=False)) if p != q), None)
        k = min(len(s_text), len(t_text)) if k is None else k
        raise ValueError(
            f"student text ({len(s_text)} bytes) and teacher text ({len(t_text)} bytes) differ at byte "
            f"{k}: {s_text[max(0, k - 12) : k + 12]!r} vs {t_text[max(0, k - 12) : k + 12]!r}"
        )
    return align(_to_spans(student_ids, sb, s_keys), _to_spans(teacher_ids, tb, t_keys))


def _bounds(g: Group, side: Side) -> tuple[int, int]:
    return (g.s0, g.s1) if side == "student" else (g.t0, g.t1)


def group_index(groups: Sequence[Group], side: Side) -> list[int]:
    """The group of each token of `side`, in token order."""
    return [k for k, g in enumerate(groups) for _ in range(*_bounds(g, side))]


def group_sums(values: Sequence[float], groups: Sequence[Group], side: Side) -> list[float]:
    """Per-token `values` of `side` summed over each group's tokens (0.0 for an empty side)."""
    return [float(sum(values[slice(*_bounds(g, side))])) for g in groups]


def group_sums_torch(values: torch.Tensor, groups: Sequence[Group], side: Side) -> torch.Tensor:
    """`values` [..., N] (tokens of `side` on the last dim) -> [..., G] group sums, differentiable."""
    import torch

    idx = torch.tensor(group_index(groups, side), dtype=torch.long, device=values.device)
    if idx.numel() != values.shape[-1]:
        raise ValueError(f"{side} has {idx.numel()} tokens in the groups, values have {values.shape[-1]}")
    out = values.new_zeros((*values.shape[:-1], len(groups)))
    return out.index_add(-1, idx, values)


def _aligned(g: Group, max_tokens: int) -> bool:
    return 1 <= g.student_len <= max_tokens and 1 <= g.teacher_len <= max_tokens


def aligned_share(groups: Sequence[Group], max_tokens: int = 2) -> float:
    """Share of student tokens in groups of 1..max_tokens tokens on each side (`kl/aligned_share`)."""
    total = sum(g.student_len for g in groups)
    return sum(g.student_len for g in groups if _aligned(g, max_tokens)) / total if total else 1.0


def size_histogram(groups: Sequence[Group]) -> dict[tuple[int, int], int]:
    """(student tokens, teacher tokens) -> number of groups of that size."""
    return dict(Counter((g.student_len, g.teacher_len) for g in groups))


def alignment_metrics(groups: Sequence[Group], max_tokens: int = 2) -> dict[str, float]:
    n_s, n_t = sum(g.student_len for g in groups), sum(g.teacher_len for g in groups)
    return {
        "kl/aligned_share": aligned_share(groups, max_tokens),
        "kl/one_to_one_share": sum(g.student_len for g in groups if _aligned(g, 1)) / n_s if n_s else 1.0,
        "kl/groups_per_student_token": len(groups) / n_s if n_s else 1.0,
        "kl/teacher_per_student_token": n_t / n_s if n_s else 1.0,
        "kl/max_group_student": float(max((g.student_len for g in groups), default=0)),
        "kl/max_group_teacher": float(max((g.teacher_len for g in groups), default=0)),
        "kl/unmatched_groups": float(sum(not g.matched for g in groups)),
    }


def place_advantages(
    group_adv: Sequence[float], groups: Sequence[Group], mode: Literal["spread", "last"] = "spread"
) -> list[float]:
    """Per-student-token advantages: A_g on every student token of g ("spread", the exact gradient
    of sum_g A_g * logp_S(g)) or on its last student token only ("last"). See the module docstring."""
    out = [0.0] * sum(g.student_len for g in groups)
    for a, g in zip(group_adv, groups, strict=True):
        for i in range(g.s0, g.s1) if mode == "spread" else range(max(g.s0, g.s1 - 1), g.s1):
            out[i] = float(a)
    return out


def place_advantages_torch(
    group_adv: torch.Tensor, groups: Sequence[Group], mode: Literal["spread", "last"] = "spread"
) -> torch.Tensor:
    """`group_adv` [..., G] -> [..., N student tokens], as `place_advantages`."""
    import torch

    idx = torch.tensor(group_index(groups, "student"), dtype=torch.long, device=group_adv.device)
    out = group_adv.index_select(-1, idx)
    if mode == "last":
        out = out * out.new_tensor(place_advantages([1.0] * len(groups), groups, "last"))
    return out
