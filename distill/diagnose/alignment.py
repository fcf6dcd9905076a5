"""Rules over cross-family OPD's alignment: whether the byte groups are fine enough for a per-token
signal, and how many samples the seam masked out (docs/cross_family.md).

Cross-family OPD cuts the student's sample and the teacher's tokens of the same text into byte
groups and computes one signal per group. Its step metrics say how fine that is:
`kl/aligned_share` (share of student tokens in groups of <= 2 tokens a side),
`bridge/seam_failure_rate` (share of samples whose conversion was not lossless: masked out), and
the group-size figures `kl/one_to_one_share`, `kl/max_group_student`, `kl/max_group_teacher`.
A same-family run logs none of them, and these rules stay silent on it. A run over several
domains logs them per domain (`kl/<domain>/aligned_share`, ...): each domain's teacher is judged on
its own rows, its findings named `alignment_coarse:<domain>`, `seam_failures:<domain>`.
"""

from __future__ import annotations

from distill.diagnose.domains import parts
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, pct
from distill.diagnose.records import RunRecord

# Below this share of student tokens in groups of <= 2 tokens a side, more than one token in
# five carries a signal shared with at least two neighbours: the per-token credit assignment
# that makes OPD denser than a sequence reward is blurred over whole words or numbers. Similar
# byte-level BPEs align at 0.9-1.0 (the zoo pair 99.9%, real Qwen vs the zoo llama: docs).
ALIGNED_SHARE_WARN = 0.8
# Above this share of samples masked out by seam failures, a visible part of the batch trains on
# nothing, and not at random: the masked samples are those holding a special the teacher has no
# counterpart for, or bytes that are not text.
SEAM_FAILURE_WARN = 0.05

GROUP_KEYS = (
    "kl/one_to_one_share",
    "kl/topk_share",
    "kl/max_group_student",
    "kl/max_group_teacher",
    "bridge/supervised_share",
)


def key_of(key: str, part: str) -> str:
    """`kl/aligned_share` as one domain of a mixed run logs it: `kl/<part>/aligned_share`."""
    head, _, tail = key.partition("/")
    return f"{head}/{part}/{tail}" if part else key


def _evidence(rec: RunRecord, keys: tuple[str, ...]) -> list[Evidence]:
    """Each logged key over the run (a property of the pair and the texts it writes); shares in %."""
    out = []
    for key in keys:
        s = rec.get(key)
        if s is None:
            continue
        if "max_" in key:  # the largest group of the run, not an average of per-step maxima
            out.append(Evidence(f"{key} (max)", s.max(), s.span()))
        else:
            out.append(Evidence(f"{key} (mean)", pct(s.mean()), s.span()))
    return out


def _coarse(rec: RunRecord, part: str, share: float, evidence: list[Evidence]) -> Finding:
    fixes = []
    if rec.cfg("method.group_advantage") == "last":
        fixes.append(
            Fix(
                "method.group_advantage",
                "spread",
                "every token of a coarse group gets its advantage (the exact gradient of the group "
                "objective); `last` trains one token of it",
            )
        )
    return Finding(
        name=f"alignment_coarse:{part}" if part else "alignment_coarse",
        severity=Severity.WARNING,
        title=f"{_where(part)}cross-family alignment is coarse: {pct(share)} of student tokens in groups "
        f"of <= 2 tokens a side (threshold {pct(ALIGNED_SHARE_WARN)})",
        evidence=evidence,
        why="The teacher's signal exists per byte group, not per token: where the two tokenizers split "
        "the same text differently, several student tokens share one group logprob and one advantage, "
        "so OPD cannot tell which of them the teacher disagrees with.",
        fixes=fixes,
        advice=f"Use a teacher whose tokenizer is closer to the student's{_for(part)} (`distill bridge check "
        "--student S --teacher T` prints a pair's granularity before a run), or `--method rose`, which "
        "trains on the teacher's continuation re-encoded in the student's tokens and needs no alignment.",
    )


def _seams(part: str, rate: float, evidence: list[Evidence]) -> Finding:
    return Finding(
        name=f"seam_failures:{part}" if part else "seam_failures",
        severity=Severity.WARNING,
        title=f"{_where(part)}{pct(rate)} of cross-family samples were seam failures and masked out "
        f"(threshold {pct(SEAM_FAILURE_WARN)})",
        evidence=evidence,
        why="A sample whose text does not cross to the teacher's tokens losslessly (a special token the "
        "teacher has no counterpart for, bytes that are not text) gets no teacher signal; the masked "
        "samples are not random, so that kind of text is never trained.",
        advice="Run `distill bridge check --student S --teacher T`: it names the first failing text. A "
        "dropped special needs a teacher counterpart with the same role or name; otherwise use a "
        f"teacher with a closer tokenizer{_for(part)} or `--method rose`.",
    )


def _where(part: str) -> str:
    return f"{part}: " if part else ""


def _for(part: str) -> str:
    return f" (teachers.{part}.name)" if part else ""


def alignment(rec: RunRecord) -> list[Finding]:
    """The run's cross-family pair; in a run over several domains, each domain's teacher on its
    own rows (a mixed run logs these figures per domain only, methods/batch.py `per_part`)."""
    names = parts(rec)
    findings: list[Finding] = []
    for part in ["", *(names if len(names) > 1 else [])]:
        findings += _pair(rec, part)
    return findings


def _pair(rec: RunRecord, part: str) -> list[Finding]:
    aligned_key, seams_key = key_of("kl/aligned_share", part), key_of("bridge/seam_failure_rate", part)
    aligned, seams = rec.get(aligned_key), rec.get(seams_key)
    if aligned is None and seams is None:
        return []  # same-family, or a method without the cross-family path
    share = aligned.mean() if aligned is not None else 1.0
    rate = seams.mean() if seams is not None else 0.0
    head = [
        Evidence(f"{aligned_key} (mean)", pct(share), aligned.span() if aligned is not None else ""),
        Evidence(f"{seams_key} (mean)", pct(rate), seams.span() if seams is not None else ""),
    ]
    evidence = head + _evidence(rec, tuple(key_of(key, part) for key in GROUP_KEYS))
    findings = []
    if share < ALIGNED_SHARE_WARN:
        findings.append(_coarse(rec, part, share, evidence))
    if rate > SEAM_FAILURE_WARN:
        findings.append(_seams(part, rate, evidence))
    if findings:
        return findings
    return [
        Finding(
            name=f"alignment:{part}" if part else "alignment",
            severity=Severity.INFO,
            title=f"{_where(part)}cross-family alignment: {pct(share)} of student tokens in groups of <= 2 "
            f"tokens a side, {pct(rate)} of samples seam failures",
            evidence=evidence,
            why="The teacher's signal is per byte group; groups this fine give it nearly per token.",
        )
    ]
