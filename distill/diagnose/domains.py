"""A run over several domains (`rlve+dapo`), one teacher each: findings per domain.

- `domain_flat`: a domain whose eval does not move while the run as a whole does: its teacher
  teaches nothing through this student (a teacher of another family whose byte groups the student
  cannot follow, a mix that starves it of prompts, a teacher no better than the student there);
- `teacher_bottleneck`: one domain's teacher takes a far larger share of the teachers' time than
  its share of the rows: the step waits for it (serve it, or give it its own engine).

Both read what the run logged per domain: `eval/<domain>/accuracy` (or `score`), the summary's
`parts`, `perf/teacher_time_s/<domain>` and the mix in the config.
"""

from __future__ import annotations

import math

from distill import registry
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, pct
from distill.diagnose.records import RunRecord

# A domain moves when its eval gains at least this (absolute accuracy) ...
MOVED = 0.03
# ... and is flat when it gains less than this while another domain of the run moved.
FLAT = 0.01
# One teacher's share of the teachers' time this many times its share of the rows is a bottleneck.
BOTTLENECK = 2.0


def parts(rec: RunRecord) -> list[str]:
    return registry.domain_parts(rec.domain) if rec.domain else []


def _lift(rec: RunRecord, part: str) -> tuple[float, float] | None:
    """(before, after) accuracy of one domain: the summary's parts, else its logged eval."""
    scores = (rec.summary.get("parts") or {}).get(part) or {}
    before, after = scores.get("student_before"), scores.get("student_after")
    if isinstance(before, dict) and isinstance(after, dict) and "accuracy" in before and "accuracy" in after:
        return float(before["accuracy"]), float(after["accuracy"])
    series = rec.get(f"eval/{part}/accuracy")
    if series is None or len(series) < 2:
        return None
    return series.first(), series.last()


def domain_flat(rec: RunRecord) -> list[Finding]:
    names = parts(rec)
    if len(names) < 2:
        return []
    lifts = {p: x for p in names if (x := _lift(rec, p)) is not None}
    moved = [p for p, (b, a) in lifts.items() if a - b >= MOVED]
    flat = [p for p, (b, a) in lifts.items() if a - b < FLAT]
    if not moved or not flat:
        return []
    findings = []
    for part in flat:
        before, after = lifts[part]
        evidence = [Evidence(f"eval/{p}/accuracy", f"{pct(b)} -> {pct(a)}") for p, (b, a) in lifts.items()]
        teacher = rec.cfg(f"teachers.{part}.name") or rec.cfg("teacher.name")
        evidence.append(Evidence(f"{part}'s teacher", str(teacher)))
        share = (rec.cfg("domain.mix") or {}).get(part)
        fixes = [Fix(f"domain.mix.{part}", fmt(2 * float(share)), "more of its prompts")] if share else []
        findings.append(
            Finding(
                name=f"domain_flat:{part}",
                severity=Severity.WARNING,
                title=f"{part} does not move ({pct(before)} -> {pct(after)}) while "
                f"{', '.join(moved)} {'does' if len(moved) == 1 else 'do'}",
                evidence=evidence,
                why="Each domain's rows are scored by its own teacher: a domain that stays where it started "
                "while the others rise gets no usable signal from its teacher, or too few of its prompts.",
                fixes=fixes,
                advice=f"run {part} alone with its teacher (`distill run --domain {part} ...`): if it does not "
                "move there either, the teacher is the cause (distill bridge check, distill diagnose).",
            )
        )
    return findings


def teacher_bottleneck(rec: RunRecord) -> list[Finding]:
    names = parts(rec)
    if len(names) < 2:
        return []
    times = {p: s.median() for p in names if (s := rec.get(f"perf/teacher_time_s/{p}")) is not None}
    total = sum(times.values())
    if len(times) < 2 or not total > 0:
        return []
    mix = rec.cfg("domain.mix") or {}
    weights = {p: float(mix.get(p, 1.0)) for p in names}
    rows = sum(weights.values())
    findings = []
    for part, seconds in times.items():
        time_share, row_share = seconds / total, weights[part] / rows
        if not math.isfinite(time_share) or time_share < BOTTLENECK * row_share or time_share < 0.5:
            continue
        teacher = rec.cfg(f"teachers.{part}.name") or rec.cfg("teacher.name")
        findings.append(
            Finding(
                name=f"teacher_bottleneck:{part}",
                severity=Severity.INFO,
                title=f"{part}'s teacher takes {pct(time_share)} of the teachers' time for {pct(row_share)} "
                "of the rows",
                evidence=[
                    *(Evidence(f"perf/teacher_time_s/{p}", t, "median step") for p, t in times.items()),
                    Evidence(f"{part}'s teacher", str(teacher)),
                ],
                why="Every step waits for its slowest teacher: one that costs far more than its share of "
                "rows sets the pace of the whole run.",
                fixes=[Fix("rollout.async_teacher", "true", "score while the student generates")],
                advice=f"serve {part}'s teacher (teachers.{part}.engine=server) or give it a GPU of its own "
                f"(teachers.{part}.device=cuda:N).",
            )
        )
    return findings
