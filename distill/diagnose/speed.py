"""Rules over where a step's time goes: the teacher (hidden or not) and the tracking store.

`perf/teacher_time_s` is the teachers' own time for the trained batch (several teachers: their sum
when they score in turn; with `rollout.async_teacher`, where they score side by side, the slowest
teacher's sum over its domains); with `rollout.async_teacher`, `perf/overlap_s` is the part of it
hidden behind the student's generation and training, and `perf/teacher_wait_s` what the step still
waited (methods/async_teacher.py). The hidden share is their sums' ratio.
"""

from __future__ import annotations

import math

import numpy as np

from distill.diagnose.findings import Evidence, Finding, Fix, Severity, pct
from distill.diagnose.records import RunRecord, Series

# Synchronous teacher scoring above this share of the median step: worth overlapping.
TEACHER_SHARE_INFO = 0.25
# With the async teacher, a typical step that waits this share of its time for the teacher: the
# teacher is slower than the student's generation and training together, and sets the step's pace
# (the zoo teacher in fp16 on a CPU: the median step waits 20%; healthy preset runs: 0%). Judged on
# medians: the first step (the worker loading its copy of the teacher, ~20 s on the zoo) and the
# first after each checkpoint score synchronously, and would otherwise read as a bottleneck.
WAIT_SHARE_WARN = 0.1
# Tracking above this share of step time slows every step (the writer should keep it ~0).
TRACKING_SHARE_WARN = 0.02


def _sum(rec: RunRecord, key: str, skip_first: bool = False) -> float:
    s = rec.get(key)
    if s is None or not len(s):
        return math.nan
    values = s.values[1:] if skip_first and len(s) > 1 else s.values
    return float(np.nansum(values))


def teacher_time(rec: RunRecord) -> list[Finding]:
    teacher, step = rec.get("perf/teacher_time_s"), rec.get("perf/step_time_s")
    if teacher is None or step is None or not len(teacher) or not len(step):
        return []
    overlap = rec.get("perf/overlap_s")
    if overlap is not None and len(overlap):
        return _async_teacher(rec, teacher, step)
    share = teacher.median() / max(step.median(), 1e-12)
    if not rec.async_teacher_capable or share < TEACHER_SHARE_INFO or rec.cfg("rollout.async_teacher"):
        return []
    return [
        Finding(
            name="teacher_time",
            severity=Severity.INFO,
            title=f"the teacher's scoring is {pct(share)} of each step, and the step waits for it",
            evidence=[
                Evidence("perf/teacher_time_s (median)", teacher.median(), teacher.span()),
                Evidence("perf/step_time_s (median)", step.median(), step.span()),
            ],
            why="The teacher can score batch i while the student generates batch i+1 and trains on batch i.",
            fixes=[Fix("rollout.async_teacher", "true", "hide the teacher's time behind the student's")],
        )
    ]


def _async_teacher(rec: RunRecord, teacher: Series, step: Series) -> list[Finding]:
    wait = rec.get("perf/teacher_wait_s")
    # Past the first step: it waits for the worker to load the teacher, not for its scoring.
    hidden = _sum(rec, "perf/overlap_s", skip_first=True) / max(
        _sum(rec, "perf/teacher_time_s", skip_first=True), 1e-12
    )
    waits = wait.median() if wait else math.nan
    wait_share = waits / max(step.median(), 1e-12) if math.isfinite(waits) else math.nan
    evidence = [
        Evidence(
            "teacher time hidden",
            pct(hidden),
            teacher.span(),
            "sum perf/overlap_s / sum perf/teacher_time_s, after the first step",
        ),
        Evidence("perf/teacher_time_s (median)", teacher.median(), teacher.span()),
        Evidence("perf/teacher_wait_s (median)", waits, teacher.span(), f"{pct(wait_share)} of a step"),
        Evidence("perf/step_time_s (median)", step.median(), step.span()),
    ]
    if wait_share >= WAIT_SHARE_WARN:
        return [
            Finding(
                name="teacher_bottleneck",
                severity=Severity.WARNING,
                title=f"asynchronous teacher: only {pct(hidden)} of its time is hidden; a typical step waits "
                f"{pct(wait_share)} of its time for it",
                evidence=evidence,
                why="The teacher scores a batch slower than the student generates and trains on the "
                "previous one, so every step still waits for the teacher.",
                advice="Give the teacher more throughput: a GPU server, more vLLM replicas or tensor "
                "parallelism, the teacher in fp32 on a CPU (bf16 matmuls are slow there), or a shorter "
                "rollout.max_new_tokens.",
            )
        ]
    return [
        Finding(
            name="teacher_overlap",
            severity=Severity.INFO,
            title=f"asynchronous teacher: {pct(hidden)} of its scoring time hidden behind the student",
            evidence=evidence,
            why="With rollout.async_teacher the teacher scores batch i while the student generates "
            "batch i+1 and trains on batch i (one step stale; the loss is exact for the batch trained).",
        )
    ]


def tracking_time(rec: RunRecord) -> list[Finding]:
    spent, step = _sum(rec, "perf/tracking_s"), _sum(rec, "perf/step_time_s")
    if not math.isfinite(spent) or not math.isfinite(step) or step <= 0:
        return []
    share = spent / step
    if share <= TRACKING_SHARE_WARN:
        return []
    return [
        Finding(
            name="tracking_slow",
            severity=Severity.WARNING,
            title=f"writing the run's records took {pct(share)} of the step time",
            evidence=[Evidence("sum perf/tracking_s / sum perf/step_time_s", pct(share))],
            why="metrics.jsonl, samples and the MLflow queue are written on the step; MLflow itself is "
            "written by a background thread, so this is local disk (a slow or network file system).",
            fixes=[Fix("tracking.sample_rows", "0", "write no rollout samples per step")],
            advice="Put the workspace (DISTILL_WORKSPACE) on a local disk.",
        )
    ]
