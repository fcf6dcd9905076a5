"""The seam check: is the trip student ids -> text -> teacher ids -> text -> student ids lossless?

For every text, each tokenizer must round-trip it on its own (text -> the ids it writes for it ->
text), and at cut points through the student's ids (including cuts inside words and inside
multi-byte characters, which are moved back to the character boundary as training does) the
prefix must cross to the teacher unchanged, the teacher's continuation (read and written in
place, after the prefix: anchor.py) must cross back unchanged, and prefix plus continuation must
read as the original text on both sides. Special tokens must map to special tokens (never appear
as literal text on the far side). Every failure is kept with an example; the seams that crossed
only through an anchor are counted (`SeamReport.anchored`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distill.tokenizer_bridge.anchor import text_ids
from distill.tokenizer_bridge.bridge import (
    Piece,
    TokenizerBridge,
    clean_cut,
    flat,
    readable,
    special_tokens,
    unicode_form,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Texts that break careless bridges: unicode (multi-byte, combining marks, ZWJ emoji), runs of
# whitespace, digit groups (the two zoo families split digits differently), words that every
# cut splits, and a response that carries think markup and ends with the end-of-turn token.
HARD_TEXTS: tuple[str, ...] = (
    "naïve café — 世界, Ελληνικά, עברית, 🙂 👩\u200d👩\u200d👧 e\u0301 ﬁ ①",
    "tabs\tand  two   three    spaces\n\n\n  indented line\r\nCRLF line  \n",
    "digits 0 7 12 345 6789 1234567890 3.14159 -42 1e-5 007",
    "multiplication multiplies multiplicatively; unbelievable antidisestablishmentarianism",
    "    leading spaces and trailing spaces    ",
    "{think}\nsmallest 3, left 5 9.\n{close}\n\nThe answer is \\boxed{{3 5 9}}{eos}",
)


@dataclass
class CheckRow:
    name: str
    cases: int = 0
    failures: list[str] = field(default_factory=list)

    def record(self, ok: bool, example: str) -> None:
        self.cases += 1
        if not ok:
            self.failures.append(example)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class SeamReport:
    same: bool
    rows: list[CheckRow]
    student_tokens: int = 0
    teacher_tokens: int = 0
    # Student specials with no teacher counterpart (dropped if they ever occur in a prefix).
    unmapped: list[str] = field(default_factory=list)
    # Seams (cuts) that crossed losslessly both ways only because a run was read or written after
    # an anchor: read and written alone, they would have gained or lost a space.
    anchored: int = 0
    seams: int = 0

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    @property
    def ratio(self) -> float:
        """Teacher tokens per student token on the checked texts."""
        return self.teacher_tokens / self.student_tokens if self.student_tokens else float("nan")


def _diff(expected: str, got: str, width: int = 24) -> str:
    """The first place two strings differ, with a little context, for a failure message."""
    i = next((j for j, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), None)
    if i is None:
        i = min(len(expected), len(got))
    lo = max(0, i - width // 2)
    return f"expected {expected[lo : i + width]!r}, got {got[lo : i + width]!r}"


def hard_texts(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase | None = None) -> list[str]:
    """HARD_TEXTS with the student's own think markup and end-of-turn token filled in. Markup the
    `teacher` has no token for (GPT-2 has no `<think>`) is left out of the texts: it cannot cross
    as markup nor as text, and the report lists it among the unmapped specials instead."""
    markup = {"think": "<think>", "close": "</think>"}
    if teacher is not None:
        theirs = set(special_tokens(teacher).values())
        markup = {key: value if value in theirs else "" for key, value in markup.items()}
    fields = {**markup, "eos": student.eos_token or ""}
    return [text.format(**fields) if "{think}" in text else text for text in HARD_TEXTS]


def normalized(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """`text` in the unicode form the tokenizer's normalizer composes it to (NFC, NFKC, ...);
    unchanged for any other normalizer (a sentencepiece `▁` rewrite is not a form of the text)."""
    form = unicode_form(tokenizer)
    return unicodedata.normalize(form, text) if form else text


def cut_points(n: int, most: int | None) -> list[int]:
    """Every boundary of an n-token sequence, or `most` of them evenly spread (ends included)."""
    if most is None or n + 1 <= most:
        return list(range(n + 1))
    return sorted({round(i * n / (most - 1)) for i in range(most)})


def check_pair(
    student: PreTrainedTokenizerBase,
    teacher: PreTrainedTokenizerBase,
    texts: Iterable[str],
    cuts: int | None = 16,
) -> SeamReport:
    bridge = TokenizerBridge(student, teacher)
    rows = {
        name: CheckRow(name)
        for name in (
            "round trip (student)",
            "round trip (teacher)",
            "prefix -> teacher",
            "continuation -> student",
            "seam (teacher side)",
            "seam (student side)",
            "specials stay special",
        )
    }
    report = SeamReport(same=bridge.same, rows=list(rows.values()))
    report.unmapped = sorted(set(bridge.student_specials.values()) - set(bridge.to_teacher_map))
    for raw in texts:
        # What the student can write at all: its normalizer's form of the text (real Qwen3 composes
        # NFC, so an NFD `e\u0301` is `é` to it). The seams are checked on that text.
        text = normalized(student, raw)
        s_ids, t_ids = text_ids(student, text), text_ids(teacher, text)
        report.student_tokens += len(s_ids)
        report.teacher_tokens += len(t_ids)
        for name, ids, pieces_of, own in (
            ("round trip (student)", s_ids, bridge.student_pieces, text),
            ("round trip (teacher)", t_ids, bridge.teacher_pieces, normalized(teacher, text)),
        ):
            got = readable(pieces_of(ids))
            rows[name].record(got == own, f"{own[:32]!r}: {_diff(own, got)}")
        whole_student = flat(bridge.student_pieces(s_ids))
        whole_teacher = bridge.to_teacher(s_ids)
        rows["specials stay special"].record(
            not _leaks(whole_teacher.source, bridge.teacher_pieces(whole_teacher.ids), teacher),
            f"{text[:32]!r}: a special token crossed as literal text",
        )
        for k in cut_points(len(s_ids), cuts):
            k = clean_cut(student, s_ids, k)
            report.seams += 1
            report.anchored += _check_cut(bridge, s_ids, k, whole_student, whole_teacher.source, rows)
    return report


def _check_cut(
    bridge: TokenizerBridge,
    s_ids: list[int],
    k: int,
    whole_student: str,
    whole_teacher: Sequence[Piece],
    rows: dict[str, CheckRow],
) -> bool:
    """One seam: the student wrote s_ids[:k], the teacher writes the rest in its own tokens.
    True when it crossed losslessly both ways only through an anchor."""
    # Texts compare in the pair's unicode form (`TokenizerBridge.canon`): one side's NFD is the
    # other side's NFC, the same text.
    canon = bridge.canon
    prefix = bridge.to_teacher(s_ids[:k])
    label = f"cut {k}/{len(s_ids)} of {readable(bridge.student_pieces(s_ids))[:32]!r}"
    got = flat(bridge.teacher_pieces(prefix.ids))
    rows["prefix -> teacher"].record(prefix.lossless, f"{label}: {_diff(flat(prefix.source), got)}")
    # The teacher's continuation, as the teacher would write the rest of the text after the prefix.
    rest = bridge.to_teacher(s_ids[k:], after=(s_ids[:k], prefix.ids))
    got = flat(bridge.teacher_pieces(prefix.ids + rest.ids))
    teacher_ok = canon(got) == canon(flat(whole_teacher))
    rows["seam (teacher side)"].record(teacher_ok, f"{label}: {_diff(flat(whole_teacher), got)}")
    back = bridge.to_student(rest.ids, after=(prefix.ids, s_ids[:k]))
    got = flat(bridge.student_pieces(back.ids, s_ids[:k]))
    rows["continuation -> student"].record(back.lossless, f"{label}: {_diff(flat(back.source), got)}")
    got = flat(bridge.student_pieces(s_ids[:k] + back.ids))
    student_ok = canon(got) == canon(whole_student)
    rows["seam (student side)"].record(student_ok, f"{label}: {_diff(whole_student, got)}")
    crossed = prefix.lossless and teacher_ok and back.lossless and student_ok
    return crossed and (prefix.anchored or rest.anchored or back.anchored)


def _leaks(source: Sequence[Piece], far: Sequence[Piece], far_tokenizer: PreTrainedTokenizerBase) -> bool:
    """A special token's content shows up as ordinary text on the far side more often than the
    near side's ordinary text spelled it."""
    names = set(special_tokens(far_tokenizer).values()) | {p.text for p in source if p.special}
    near_text = "".join(p.text for p in source if not p.special)
    far_text = "".join(p.text for p in far if not p.special)
    return any(far_text.count(name) > near_text.count(name) for name in names)
