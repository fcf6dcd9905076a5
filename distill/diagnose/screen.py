"""Before a rule blames a hyper-parameter, the causes the run's own records can show are checked.

A rule whose finding is an outcome (the eval fell, the KL rose, the loss stalled, the top-k mass
left the teacher's tokens, the clamp binds, samples repeat) and whose fix changes a
hyper-parameter (`optim.*`, the sampling, the clamp) is screened after all rules ran
(`diagnose.diagnose`): each cause is written into its evidence as ruled out (with the numbers
that rule it out), a cause (naming the finding that reports it), or not ruled out (the record
that would show it is missing). The causes:

- a teacher weaker than the student before training (causes.teacher_weaker);
- a pairing fault: chat templates or thinking modes that differ, the teacher being the student
  (pairing.py);
- truncation the run started with: the teacher's targets cut at its budget, the student's
  rollouts or its step-0 eval cut from the start (a rise during training is a symptom, not a
  cause, and is not counted here).

A teacher or pairing cause takes the finding over: it becomes info, its hyper-parameter fixes go,
and its title names the cause (the fix is the cause's own). Truncation keeps the finding's
severity (truncation can also follow the fault, e.g. a teacher sampling at temperature 3 never
ends) but drops its hyper-parameter fixes: a budget comes before an lr.
"""

from __future__ import annotations

from dataclasses import dataclass

from distill.diagnose import pairing
from distill.diagnose.causes import standings
from distill.diagnose.findings import Evidence, Finding, Severity, pct
from distill.diagnose.records import RunRecord
from distill.diagnose.rules import STUDENT_END_WARN, teacher_budget, teacher_truncation

TEACHER, PAIRING, TRUNCATION = (
    "a teacher weaker than the student",
    "a template or thinking mismatch",
    "truncation",
)
# Which causes each screened rule checks (a cause that cannot produce the outcome is not checked:
# no teacher makes samples repeat, only a budget that cuts them alike).
SCREENED: dict[str, tuple[str, ...]] = {
    "eval_regression": (TEACHER, PAIRING, TRUNCATION),
    "kl_rising": (TEACHER, PAIRING, TRUNCATION),
    "training_stalled": (TEACHER, PAIRING, TRUNCATION),
    "teacher_gap": (TEACHER, PAIRING, TRUNCATION),
    "topk_mass_collapse": (TEACHER, PAIRING, TRUNCATION),
    "clamp_saturated": (PAIRING,),
    "duplicate_rollouts": (TRUNCATION,),
}
# Causes that take the finding over (info); the others only take the hyper-parameter fixes away.
TAKES_OVER = (TEACHER, PAIRING)
# The keys of a fix that tunes the training rather than repairing its inputs.
HYPER = ("optim.", "rollout.temperature", "rollout.num_generations", "method.advantage_clip", "method.name")


@dataclass(frozen=True)
class Check:
    cause: str
    held_by: str  # the finding that reports the cause when it holds, else ""
    line: Evidence


def _teacher(rec: RunRecord) -> Check:
    found = standings(rec)
    if not found:
        why = (
            "eval.eval_teacher=false" if rec.cfg("eval.eval_teacher") is False else "no step-0 evals of both"
        )
        return Check(TEACHER, "", Evidence(f"not ruled out: {TEACHER}", f"no teacher eval at step 0 ({why})"))
    weak = [s for s in found if (s.severity() or Severity.INFO) >= Severity.WARNING]
    if weak:
        name = f"teacher_weaker:{weak[0].part}" if weak[0].part else "teacher_weaker"
        return Check(
            TEACHER,
            name,
            Evidence(f"cause: {TEACHER}", "; ".join(s.text() for s in weak), note=f"see {name}"),
        )
    return Check(TEACHER, "", Evidence(f"ruled out: {TEACHER}", "; ".join(s.text() for s in found)))


def _pairing(rec: RunRecord) -> Check:
    found = [
        f
        for f in (*pairing.thinking(rec), *pairing.template(rec), *pairing.same_model(rec))
        if f.severity >= Severity.WARNING
    ]
    if found:
        return Check(
            PAIRING, found[0].name, Evidence(f"cause: {PAIRING}", found[0].title, note=f"see {found[0].name}")
        )
    check = rec.preflight_check("chat_template")
    models = rec.manifest.get("models", {})
    vocabs = {models.get(side, {}).get("vocab") for side in ("student", "teacher")}
    if check is not None and check.get("ok") is not False:
        how = "preflight rendered both prompts token for token: equal"
    elif rec.teacher_role != "scores":
        how = f"the teacher writes its own text ({rec.method}): no score after the student's prompt"
    elif len(vocabs) == 2 and None not in vocabs:
        how = "cross-family: the teacher renders its own template by design"
    else:
        (s_text, _), (t_text, _) = (
            pairing.template_text(rec, "student"),
            pairing.template_text(rec, "teacher"),
        )
        if s_text is None or t_text is None:
            return Check(
                PAIRING, "", Evidence(f"not ruled out: {PAIRING}", "no preflight check and no template text")
            )
        how = "the two chat templates are the same text"
    return Check(PAIRING, "", Evidence(f"ruled out: {PAIRING}", f"{how}; thinking modes equal"))


def _truncation(rec: RunRecord) -> Check:
    seen: list[str] = []
    held: list[tuple[str, str]] = []
    tb = teacher_budget(rec)
    if tb.truncation is not None or tb.share is not None:
        trunc = tb.truncation.mean() if tb.truncation else 0.0
        seen.append(f"teacher {pct(trunc)} truncated")
        if any(f.severity >= Severity.WARNING for f in teacher_truncation(rec)):
            held.append(("teacher_truncation", f"the teacher's targets: {pct(trunc)} truncated"))
    student = rec.get("student/truncation_rate")
    if student is not None:
        start = student.window(0.2, last=False, min_points=1)
        seen.append(f"student rollouts {pct(start.mean())} at the start ({start.span()})")
        if start.mean() >= STUDENT_END_WARN:
            held.append(("student_truncation", f"student rollouts {pct(start.mean())} cut from the start"))
    for bench in rec.benches():
        s = rec.get(f"eval/{bench}/truncation_rate")
        if s is None or int(s.steps[0]) != 0:
            continue
        seen.append(f"eval {pct(s.first())} at step 0")
        if s.first() >= STUDENT_END_WARN:
            held.append((f"eval_truncation:{bench}", f"the step-0 eval: {pct(s.first())} cut"))
    if held:
        return Check(
            TRUNCATION,
            held[0][0],
            Evidence(f"cause: {TRUNCATION}", "; ".join(h[1] for h in held), note=f"see {held[0][0]}"),
        )
    if not seen:
        return Check(TRUNCATION, "", Evidence(f"not ruled out: {TRUNCATION}", "no truncation figure logged"))
    return Check(TRUNCATION, "", Evidence(f"ruled out: {TRUNCATION}", "; ".join(seen)))


CHECKS = {TEACHER: _teacher, PAIRING: _pairing, TRUNCATION: _truncation}


def _run(cause: str, rec: RunRecord) -> Check:
    try:
        return CHECKS[cause](rec)
    except Exception as exc:  # a record a check cannot read leaves the cause open, not the diagnosis
        return Check(
            cause, "", Evidence(f"not ruled out: {cause}", f"the check raised {type(exc).__name__}: {exc}")
        )


def screened(rec: RunRecord, findings: list[Finding]) -> list[Finding]:
    """Each screened finding with the causes it checks in its evidence; one that a cause explains
    defers to it (see the module docstring)."""
    done: dict[str, Check] = {}
    for f in findings:
        causes = SCREENED.get(f.name.partition(":")[0])
        if causes is None:
            continue
        for cause in causes:
            if cause not in done:
                done[cause] = _run(cause, rec)
        checks = [done[c] for c in causes]
        f.evidence = [*f.evidence, *(c.line for c in checks)]
        held = [c for c in checks if c.held_by]
        if not held:
            continue
        f.fixes = [x for x in f.fixes if not x.key.startswith(HYPER)]
        first = held[0]
        lead = f"fix {first.cause} first (see {first.held_by})"
        f.advice = f"{lead}; {f.advice}" if f.advice else lead
        if first.cause in TAKES_OVER:
            f.severity = Severity.INFO
            f.title += f" (explained by {first.cause}: see {first.held_by})"
    return findings
