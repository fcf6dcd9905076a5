"""A student's sample on the teacher's side, for cross-family OPD: its teacher tokens, its byte
groups (align.py), the vocabulary map, and how fine the alignment of a pair is.

    align_sample(bridge, ids)         one student completion -> teacher ids + groups, or a seam failure
    vocab_map(student, teacher)       teacher id -> the student id with the same bytes (specials by role)
    granularity(student, teacher, texts)   a pair's alignment figures on texts (`distill bridge check`)
    group_table(student, s_ids, teacher, t_ids, groups)   one sample's groups side by side (preflight)

A conversion that is not lossless (a special the teacher has no counterpart for, text that does
not read back the same) or whose bytes do not align (invalid UTF-8 inside the sample) is a *seam
failure*: the sample gets no groups and the loss masks it out. Tokens at the end of a sample that
stop inside a multi-byte character (a rollout cut at its budget) are left out of the groups, not
counted as a failure: they are not text yet on either side.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from distill.tokenizer_bridge.align import (
    Group,
    _byte_level,
    _sentencepiece,
    align_tokens,
    alignment_metrics,
    size_histogram,
    special_keys,
    token_bytes,
)
from distill.tokenizer_bridge.bridge import trim_partial

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.tokenizer_bridge.bridge import TokenizerBridge

SHOWN_GROUPS = 24

# tokenizer -> ((its size, its template), vocab_bytes of it).
_VOCAB_CACHE: WeakKeyDictionary[
    PreTrainedTokenizerBase, tuple[tuple[int, str | None], dict[int, bytes | str]]
] = WeakKeyDictionary()


@dataclass
class AlignedSample:
    """One student completion as the teacher scores it, and its byte groups."""

    teacher_ids: list[int]  # the completion in the teacher's tokens ([] on a seam failure)
    groups: list[Group]  # over student tokens [0, kept) and teacher_ids
    kept: int  # student tokens inside the groups (a trailing partial character is not)
    failure: str = ""  # why this sample is a seam failure; "" when it is not
    student_ids: list[int] = field(default_factory=list)  # the student's tokens [0, kept)

    @property
    def ok(self) -> bool:
        return not self.failure


def align_sample(bridge: TokenizerBridge, student_ids: Sequence[int]) -> AlignedSample:
    """The student's ids in the teacher's tokens (specials by role, text re-encoded) and the groups.

    A shared tokenizer needs no conversion: the teacher scores the student's own ids, so the
    groups are one token a side and the path reduces exactly to same-family OPD (the student
    may sample a non-canonical split that re-encoding would merge).
    """
    ids = [int(i) for i in student_ids]
    if bridge.same:
        kept, teacher_ids = ids, list(ids)
    else:
        kept = trim_partial(bridge.student, ids)
        crossed = bridge.to_teacher(kept)
        if not crossed.lossless:
            why = f"dropped {', '.join(crossed.dropped)}" if crossed.dropped else "text does not read back"
            return AlignedSample([], [], 0, f"lossy conversion ({why})")
        teacher_ids = crossed.ids
    try:
        al = align_tokens(bridge.student, kept, bridge.teacher, teacher_ids)
    except ValueError as exc:
        return AlignedSample([], [], 0, f"bytes do not align: {exc}")
    return AlignedSample(teacher_ids, al.groups, len(kept), student_ids=list(kept))


def _reader(tokenizer: PreTrainedTokenizerBase) -> str:
    """How a single vocabulary entry reads as bytes: "byte_level", "sentencepiece" or "decode"."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "decode"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
    if "ByteLevel" in kinds:
        return "byte_level"
    return "sentencepiece" if kinds & {"ByteFallback", "Metaspace"} else "decode"


def vocab_bytes(tokenizer: PreTrainedTokenizerBase) -> dict[int, bytes | str]:
    """Every vocabulary id -> its bytes, or its special key (str) for a special token. Cached per
    tokenizer (while its size and template stay): a cross-family pair reads each vocabulary up to
    three times (the prefix index, the byte table, the id map), ~2 s each for 151k entries."""
    stamp = (len(tokenizer), getattr(tokenizer, "chat_template", None))
    cached = _VOCAB_CACHE.get(tokenizer)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    out = _vocab_bytes(tokenizer)
    _VOCAB_CACHE[tokenizer] = (stamp, out)
    return out


def _vocab_bytes(tokenizer: PreTrainedTokenizerBase) -> dict[int, bytes | str]:
    keys = special_keys(tokenizer)
    reader = _reader(tokenizer)
    out: dict[int, bytes | str] = {}
    for token, i in tokenizer.get_vocab().items():
        if i in keys:
            out[i] = keys[i]
        elif reader == "byte_level":
            out[i] = _byte_level(token)
        elif reader == "sentencepiece":
            out[i] = _sentencepiece(token)
        else:  # one decode per entry: slow, only for tokenizers of neither kind
            out[i] = b"".join(token_bytes(tokenizer, [i], keys))
    return out


def vocab_map(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> list[int]:
    """teacher id -> the student id whose token has the same bytes (specials: the same key, so eos
    <-> eos), -1 where the student has none. One-to-one: where several ids share bytes the lowest
    wins on each side, so no student probability is counted twice. Computed once per pair."""
    by_bytes: dict[bytes | str, int] = {}
    for i, value in sorted(vocab_bytes(student).items()):
        if value != b"":
            by_bytes.setdefault(value, i)
    teacher_vocab = vocab_bytes(teacher)
    out = [-1] * (max(teacher_vocab, default=-1) + 1)
    used: set[int] = set()
    for i, value in sorted(teacher_vocab.items()):
        j = by_bytes.get(value)
        if j is not None and j not in used:
            out[i] = j
            used.add(j)
    return out


@dataclass
class Granularity:
    """How fine a pair's alignment is on a set of texts (what a per-token signal can resolve)."""

    samples: int = 0
    seam_failures: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # align.alignment_metrics, over all texts
    sizes: dict[tuple[int, int], int] = field(default_factory=dict)  # (student, teacher) tokens -> groups

    @property
    def seam_failure_rate(self) -> float:
        return len(self.seam_failures) / self.samples if self.samples else 0.0

    def common_sizes(self, n: int = 5) -> list[tuple[tuple[int, int], int]]:
        return sorted(self.sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def granularity(bridge: TokenizerBridge, texts: Iterable[str]) -> Granularity:
    """Each text as the student would write it (its own tokens, then its eos), crossed and aligned."""
    out = Granularity()
    groups: list[Group] = []
    eos = bridge.student.eos_token_id
    for text in texts:
        ids = list(bridge.student(text, add_special_tokens=False)["input_ids"])
        sample = align_sample(bridge, ids + ([int(eos)] if isinstance(eos, int) else []))
        out.samples += 1
        if not sample.ok:
            out.seam_failures.append(f"{text[:32]!r}: {sample.failure}")
        groups += sample.groups
    out.metrics = alignment_metrics(groups)
    out.sizes = size_histogram(groups)
    return out


def _cell(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], keys: dict[int, str]) -> str:
    parts = token_bytes(tokenizer, ids, keys)
    return " ".join(
        f"<{keys[int(i)]}>" if int(i) in keys else repr(b.decode("utf-8", "backslashreplace"))[1:-1] or "''"
        for i, b in zip(ids, parts, strict=True)
    )


def group_table(
    student: PreTrainedTokenizerBase,
    student_ids: Sequence[int],
    teacher: PreTrainedTokenizerBase,
    teacher_ids: Sequence[int],
    groups: Sequence[Group],
    limit: int = SHOWN_GROUPS,
) -> str:
    """One sample's groups as rows: student tokens | teacher tokens | the bytes they both cover.
    Rows of more than one token on a side are marked `*` (the signal is per group there)."""
    s_keys, t_keys = special_keys(student), special_keys(teacher)
    data = b"".join(token_bytes(student, student_ids, s_keys))
    rows = [
        (
            "*" if g.student_len > 1 or g.teacher_len > 1 else " ",
            _cell(student, student_ids[g.s0 : g.s1], s_keys),
            _cell(teacher, teacher_ids[g.t0 : g.t1], t_keys),
            f"<{g.special}>" if g.special else repr(data[g.start : g.end]),
        )
        for g in groups[:limit]
    ]
    w_s = max([len("student tokens"), *(len(r[1]) for r in rows)])
    w_t = max([len("teacher tokens"), *(len(r[2]) for r in rows)])
    lines = [f"    {'student tokens':<{w_s}} | {'teacher tokens':<{w_t}} | bytes"]
    lines += [f"  {m} {s:<{w_s}} | {t:<{w_t}} | {b}" for m, s, t, b in rows]
    if len(groups) > limit:
        lines.append(f"    ... {len(groups) - limit} more groups")
    return "\n".join(lines)
