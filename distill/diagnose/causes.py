"""Causes a run's own records show before any hyper-parameter is blamed:

- `teacher_weaker`: the teacher scored below the student before training (both step-0 evals,
  `summary.json` `teacher_score` against `student_before`, paired over the items both eval files
  hold). Every method moves the student toward its teacher, so what follows is the teacher's
  doing: the fix is a stronger teacher, or teacher-SFT's filter on the teacher's verified samples
  (`method.keep_verified_only`), never a smaller learning rate. A run says it right after its
  step-0 evals (`start_note`), diagnose says it again at the end.
- `duplicate_rollouts`: a share of each step's samples repeating another sample of the same
  prompt id for id (`student/duplicate_share`, methods/batch.py: each response's first copy not
  counted): those samples carry no signal the first copy did not (near-greedy sampling with
  several samples a prompt).

The rules whose fix changes a hyper-parameter check these causes first (screen.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from distill.diagnose.eval_rules import NOISE_SE, files_se, summary_headline
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, pct
from distill.diagnose.records import RunRecord

# The teacher below the student before training by this much (absolute; and beyond NOISE_SE
# standard errors of the difference) is the cause of what follows: the same size of fall that is
# a regression (eval_rules.REGRESSION_WARN); by REGRESSION_ERROR's 15 points it is an error.
WEAKER_WARN, WEAKER_ERROR = 0.05, 0.15
# The median step's share of samples that repeat another sample of the same prompt (each
# response's first copy not counted, methods/batch.py). At 0.5 half of what a step sampled is a
# copy: with 2 samples a prompt, every prompt's two are one response. The rlve OPD preset
# (temperature 0.3, 2 samples a prompt) logs a median 0.27 over its 200 steps, 0.47 in its worst
# step, as its student sharpens; near-greedy sampling with 4 a prompt logs 0.73 (at most 0.75).
DUPLICATE_WARN = 0.5


@dataclass(frozen=True)
class Standing:
    """The teacher against the student before training, on one domain's step-0 evals."""

    part: str  # "" for a one-domain run, else the domain
    headline: str  # accuracy, else the episode score
    student: float
    teacher: float
    se: float
    how: str

    @property
    def below(self) -> float:
        return self.student - self.teacher

    def severity(self) -> Severity | None:
        """None when the teacher is ahead; info when it is behind within the eval's noise."""
        if self.below <= 0:
            return None
        if self.below < WEAKER_WARN or (self.se > 0 and self.below < NOISE_SE * self.se):
            return Severity.INFO
        return Severity.ERROR if self.below >= WEAKER_ERROR else Severity.WARNING

    def text(self) -> str:
        where = f"{self.part}: " if self.part else ""
        return f"{where}teacher {_level(self.headline, self.teacher)} vs student {_level(self.headline, self.student)} before training"


def _level(name: str, value: float) -> str:
    return pct(value) if name == "accuracy" else fmt(value)


def standings(rec: RunRecord) -> list[Standing]:
    """The teacher against the student at step 0, per domain in a run over several (each by its
    own teacher); empty when the teacher was not evaluated (`eval.eval_teacher=false`)."""
    parts = rec.summary.get("parts")
    if isinstance(parts, dict) and len(parts) > 1:
        entries = [
            (str(p), s.get("student_before"), s.get("teacher_score"))
            for p, s in parts.items()
            if isinstance(s, dict)
        ]
    else:
        entries = [("", rec.summary.get("student_before"), rec.summary.get("teacher_score"))]
    out = []
    for part, before, teacher in entries:
        name = summary_headline(before, teacher)
        if name is None or not isinstance(before, dict) or not isinstance(teacher, dict):
            continue
        try:
            b, t = float(before[name]), float(teacher[name])
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(b) and math.isfinite(t)):
            continue
        folder = f"{part}/" if part else ""
        mine, theirs = rec.eval_file(0, folder), rec.eval_file(0, f"teacher/{folder}")
        items = rec.cfg("eval.items")
        n = (
            len(mine.rows)
            if mine is not None and mine.rows
            else (int(items) if isinstance(items, int) else None)
        )
        se, how = files_se(mine, theirs, (b + t) / 2, n)
        out.append(Standing(part, name, b, t, se, how))
    return out


def _teacher_fixes(rec: RunRecord) -> list[Fix]:
    """What lets a run learn from a weaker teacher: only its samples the domain verified correct."""
    role = rec.teacher_role
    if role in ("writes", "continues") and rec.cfg("method.keep_verified_only") is False:
        return [
            Fix("method.keep_verified_only", "true", "train only on the teacher's samples verified correct")
        ]
    if role == "scores" and not rec.own_teacher:
        return [
            Fix(
                "method.name",
                "sft",
                "teacher-SFT trains only on the teacher's samples verified correct (method.keep_verified_only, "
                "its default); OPD follows every token of the weaker teacher",
            )
        ]
    return []


def teacher_weaker(rec: RunRecord) -> list[Finding]:
    out = []
    for st in standings(rec):
        severity = st.severity()
        if severity is None:
            continue
        section = f"teachers.{st.part}" if st.part and isinstance(rec.cfg("teachers"), dict) else "teacher"
        noise = severity == Severity.INFO
        where = f" ({st.part})" if st.part else ""
        out.append(
            Finding(
                name=f"teacher_weaker:{st.part}" if st.part else "teacher_weaker",
                severity=severity,
                title=f"the teacher{where} scores below the student before training: "
                f"{_level(st.headline, st.teacher)} vs {_level(st.headline, st.student)}"
                + (f" (within {NOISE_SE:g} standard errors)" if noise else ""),
                evidence=[
                    Evidence(f"summary.json student_before.{st.headline}", st.student, "step 0"),
                    Evidence(f"summary.json teacher_score.{st.headline}", st.teacher, "step 0"),
                    Evidence("standard error of the difference", st.se, note=st.how),
                ],
                why="Every method moves the student toward its teacher (OPD and OPSD: the teacher's "
                "per-token distribution; SFT and ROSE: the teacher's text). A teacher below the student "
                "pulls it down: a fall in the eval that follows is the teacher's, and no learning rate fixes "
                "it (a smaller one only slows the fall).",
                fixes=[] if noise else _teacher_fixes(rec),
                advice=""
                if noise
                else f"a stronger teacher ({section}.name): one whose step-0 eval is above the "
                f"student's {_level(st.headline, st.student)}",
            )
        )
    return out


def start_note(run_dir: Path) -> str | None:
    """The line a run prints after its step-0 evals when its teacher scores below its student
    (beyond the eval's noise); None otherwise, or when the run's records cannot be read."""
    from distill.diagnose.records import load_run

    try:
        found = [f for f in teacher_weaker(load_run(run_dir)) if f.severity >= Severity.WARNING]
    except Exception:  # a note that cannot be made must not stop the run it is about
        return None
    if not found:
        return None
    fixes = [x.override for f in found for x in f.fixes]
    then = f"; fix: {fixes[0]} or a stronger teacher" if fixes else "; fix: a stronger teacher"
    return f"note: {'; '.join(f.title for f in found)}: what follows is the teacher's doing{then}"


def duplicate_rollouts(rec: RunRecord) -> list[Finding]:
    s = rec.get("student/duplicate_share")
    if s is None:
        return []
    # The median step: a few steps of easy prompts answered alike are not the sampling's doing.
    level = s.median()
    if level < DUPLICATE_WARN:
        return []
    n, temperature = rec.cfg("rollout.num_generations"), rec.cfg("rollout.temperature")
    evidence = [
        Evidence(
            s.key, level, s.span(), "median share of a step's samples repeating another of the same prompt"
        ),
        Evidence(s.key, s.mean(), s.span(), "mean"),
    ]
    fixes: list[Fix] = []
    if isinstance(temperature, int | float):
        evidence.append(Evidence("rollout.temperature", float(temperature)))
        hotter = _hotter(rec, float(temperature))
        if hotter is not None:
            fixes.append(Fix("rollout.temperature", fmt(hotter[0]), hotter[1]))
    if isinstance(n, int):
        evidence.append(Evidence("rollout.num_generations", n))
        if n > 2:  # on-policy training through GRPO takes at least 2 samples a prompt
            fixes.append(
                Fix("rollout.num_generations", str(max(2, n // 2)), "fewer copies of one response a prompt")
            )
    return [
        Finding(
            name="duplicate_rollouts",
            severity=Severity.WARNING,
            title=f"{pct(level)} of the median step's rollouts repeat another sample of the same prompt",
            evidence=evidence,
            why="A sample repeating another of its prompt is scored and trained on again with the same "
            "signal: its generation and teacher time buy nothing, and the step sees fewer distinct "
            "responses than it paid for (near-greedy sampling with several samples a prompt).",
            fixes=fixes,
        )
    ]


def _hotter(rec: RunRecord, temperature: float) -> tuple[float, str] | None:
    """A higher rollout temperature: the domain's preset's where it samples hotter than the run,
    else twice the run's, at most 1."""
    from distill.config import ConfigError, preset_path, read_yaml

    try:
        rollout = read_yaml(preset_path(rec.domain, rec.method)).get("rollout")
    except ConfigError:  # no preset for this domain and method (a mix, a custom domain)
        rollout = None
    preset = rollout.get("temperature") if isinstance(rollout, dict) else None
    if isinstance(preset, int | float) and preset > temperature:
        return float(preset), f"the {rec.domain} {rec.method} preset's sampling temperature"
    if temperature >= 1.0:
        return None
    return min(1.0, 2 * temperature), "twice the run's, for samples that differ"
