"""Rules over how the student and teacher were paired: thinking mode, chat templates, the teacher
being the student itself, tokenizer families, and preflight checks that failed.

These read the config, the manifest (where each model was loaded from) and `preflight.json`;
the templates are read from the model folders (`chat_template.jinja`, else the tokenizer
config's `chat_template`) or from a configured template file. Nothing is loaded but text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt
from distill.diagnose.records import RunRecord

# Preflight checks a dedicated rule reports with its numbers (not again as `preflight_failed`).
OWN_RULE_CHECKS = ("thinking_mode", "chat_template", "teacher_reference")
# The first steps' reverse KL below this: the teacher agrees with the student on every token.
NO_SIGNAL_KL = 1e-6


def _failed_checks(node: Any, path: str = "") -> list[str]:
    """Names of preflight checks marked failed (`ok`/`passed` false, or a failing status)."""
    if not isinstance(node, dict):
        return []
    out = []
    if (
        node.get("ok") is False
        or node.get("passed") is False
        or str(node.get("status", "")).lower() in ("fail", "failed", "error")
    ):
        out.append(path or "preflight")
    for key, child in node.items():
        out += _failed_checks(child, f"{path}.{key}" if path else str(key))
    return out


def teacher_sides(rec: RunRecord) -> list[tuple[str, Any]]:
    """(config section, its enable_thinking) of each teacher: `teachers.<domain>` for a run with a
    teacher per domain (its `teacher` is then a placeholder nothing renders with), else `teacher`."""
    teachers = rec.cfg("teachers")
    if isinstance(teachers, dict) and teachers:
        return [
            (f"teachers.{d}", t.get("enable_thinking") if isinstance(t, dict) else None)
            for d, t in teachers.items()
        ]
    return [("teacher", rec.cfg("teacher.enable_thinking"))]


def thinking(rec: RunRecord) -> list[Finding]:
    s_think = rec.cfg("student.enable_thinking")
    sides = teacher_sides(rec)
    out = []
    for section, t_think in sides:
        if s_think == t_think:
            continue
        explicit = s_think is not None and t_think is not None
        value = s_think if s_think is not None else t_think
        fix_side = section if s_think is not None else "student"
        domain = section.partition(".")[2]
        whose = f"{domain}'s teacher" if domain else "teacher"
        out.append(
            Finding(
                name=f"thinking_mismatch:{domain}" if domain else "thinking_mismatch",
                severity=Severity.ERROR if explicit else Severity.WARNING,
                title=f"thinking mode differs: student {s_think}, {whose} {t_think}"
                + ("" if explicit else " (None: the model family's default)"),
                evidence=[
                    Evidence("student.enable_thinking", str(s_think)),
                    Evidence(f"{section}.enable_thinking", str(t_think)),
                ],
                why="Student and teacher render the chat template differently (one opens a <think> block, "
                "the other does not): the teacher scores or continues text in a format it was not prompted "
                "for, so the signal measures the format gap, not the reasoning.",
                fixes=[Fix(f"{fix_side}.enable_thinking", str(value).lower(), "the same mode on both sides")],
            )
        )
    return out


def template_text(rec: RunRecord, side: str) -> tuple[str | None, str]:
    """The chat template `side` rendered with, and where it was read; (None, "") if unknown."""
    configured = rec.cfg(f"{side}.chat_template")
    if isinstance(configured, str) and configured:
        path = Path(configured)
        return (path.read_text(errors="replace") if path.is_file() else None), f"{side}.chat_template"
    folder = rec.manifest.get("models", {}).get(side, {}).get("path")
    if not isinstance(folder, str) or not Path(folder).is_dir():
        return None, ""
    jinja = Path(folder) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(errors="replace"), str(jinja)
    config = Path(folder) / "tokenizer_config.json"
    try:
        template = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    except ValueError:
        template = None
    return (template if isinstance(template, str) else None), str(config)


def _jinja_file(rec: RunRecord, side: str) -> str | None:
    """The template file `side` rendered with (configured, else its folder's), if it is one."""
    configured = rec.cfg(f"{side}.chat_template")
    if isinstance(configured, str) and Path(configured).is_file():
        return configured
    folder = rec.manifest.get("models", {}).get(side, {}).get("path")
    jinja = Path(folder) / "chat_template.jinja" if isinstance(folder, str) else None
    return str(jinja) if jinja is not None and jinja.is_file() else None


def template(rec: RunRecord) -> list[Finding]:
    """Same-family scoring with two different chat templates (the preflight's `chat_template`
    check failed, or was not run and the template texts differ)."""
    # A teacher that scores the student's own ids after the student's prompt: a template that
    # renders the prompt differently scores the tokens in a context it never saw.
    if rec.teacher_role != "scores":
        return []
    check = rec.preflight_check("chat_template")
    if check is not None and check.get("ok") is not False:
        return []  # compared token for token and equal
    models = rec.manifest.get("models", {})
    st, te = models.get("student", {}), models.get("teacher", {})
    if st.get("vocab") and te.get("vocab") and st["vocab"] != te["vocab"]:
        return []  # cross-family OPD renders the teacher's own template by design
    evidence = []
    if check is not None:
        evidence.append(
            Evidence("preflight.json chat_template", "failed", note=str(check.get("detail", ""))[:300])
        )
    else:
        (s_text, s_from), (t_text, t_from) = template_text(rec, "student"), template_text(rec, "teacher")
        if s_text is None or t_text is None or s_text == t_text:
            return []
        evidence += [
            Evidence("student template", f"{len(s_text)} characters", note=s_from),
            Evidence("teacher template", f"{len(t_text)} characters", note=t_from),
            Evidence("preflight", "off" if rec.cfg("preflight") is False else "no chat_template check"),
        ]
    # The student's rendering is what the rollouts were sampled under: the teacher follows it.
    s_file = _jinja_file(rec, "student")
    fixes = []
    if s_file is not None and s_file != rec.cfg("teacher.chat_template"):
        fixes.append(Fix("teacher.chat_template", s_file, "render the teacher's prompt as the student's"))
    return [
        Finding(
            name="template_mismatch",
            severity=Severity.ERROR,
            title="student and teacher chat templates differ: the teacher scores the student's tokens after "
            "a prompt it renders differently",
            evidence=evidence,
            why="The teacher's logprobs are conditioned on its own rendering of the prompt; with another "
            "template every token is scored in a context the student never wrote, and the per-token signal "
            "measures the template gap (tinker-cookbook #796: a base-model renderer against an instruct "
            "teacher's).",
            fixes=fixes,
            advice=""
            if fixes
            else "give both the same template (student.chat_template / teacher.chat_template) "
            "and keep preflight on: it compares the two renderings token for token",
        )
    ]


def same_model(rec: RunRecord) -> list[Finding]:
    """A teacher that is the student (same weights): the signal is zero by construction. OPSD
    shares the weights by design (its teacher differs by the privileged prompt)."""
    if rec.own_teacher:
        return []
    models = rec.manifest.get("models", {})
    s_path, t_path = models.get("student", {}).get("path"), models.get("teacher", {}).get("path")
    s_name, t_name = rec.cfg("student.name"), rec.cfg("teacher.name")
    evidence = []
    if s_path and s_path == t_path:
        evidence.append(Evidence("manifest models.student.path = models.teacher.path", str(s_path)))
    elif not (s_path and t_path) and s_name and s_name == t_name:
        evidence.append(Evidence("student.name = teacher.name", str(s_name)))
    same = bool(evidence)
    kl = rec.get("kl/reverse_kl_mean")
    if kl is not None:
        head = kl.window(0.2, last=False, min_points=1)
        level = float(abs(head.values).max())
        if not same and level >= NO_SIGNAL_KL:
            return []
        evidence.append(Evidence("kl/reverse_kl_mean (max |.|)", level, head.span(), "the teacher's signal"))
    if not evidence:
        return []
    title = "the same model" if same else f"reverse KL {fmt(evidence[-1].value)} from the first steps"
    zoo = str(s_name).startswith("zoo:") and t_name != "zoo:teacher"
    fixes = (
        [Fix("teacher.name", "zoo:teacher", "the embedded teacher, stronger than the student")] if zoo else []
    )
    return [
        Finding(
            name="teacher_is_student",
            severity=Severity.ERROR,
            title=f"the teacher is the student: {title}",
            evidence=evidence,
            why="A teacher with the student's own weights agrees with it on every token: the advantage "
            "(logp_teacher - logp_student) and the KL are zero, and training only adds noise.",
            fixes=fixes,
            advice="set teacher.name to a stronger model; for self-distillation with a privileged prompt "
            "use --method opsd",
        )
    ]


def families(rec: RunRecord) -> list[Finding]:
    models = rec.manifest.get("models", {})
    st, te = models.get("student", {}), models.get("teacher", {})
    if st.get("vocab") and te.get("vocab") and st["vocab"] != te["vocab"]:
        # OPD crosses by byte groups (alignment.py judges how fine); OPSD has one model, so a
        # second vocabulary there means the run is not what it claims.
        same_ids = rec.own_teacher
        return [
            Finding(
                name="cross_family",
                severity=Severity.ERROR if same_ids else Severity.INFO,
                title=f"student and teacher tokenizers differ: vocab {st['vocab']} vs {te['vocab']} "
                f"({st.get('class')} / {te.get('class')})",
                evidence=[
                    Evidence("manifest models.student", f"{st.get('class')}, vocab {st['vocab']}"),
                    Evidence("manifest models.teacher", f"{te.get('class')}, vocab {te['vocab']}"),
                ],
                why="OPSD distils a model into itself: the teacher must be the student's own weights."
                if same_ids
                else "Cross-family: the teacher sees the student's text through the tokenizer bridge "
                "(OPD: per byte group, docs/cross_family.md); check its seams.",
                fixes=[],
                advice=""
                if same_ids
                else "run `distill bridge check --student S --teacher T` if no preflight.json",
            )
        ]
    if st.get("class") and te.get("class") and st["class"] != te["class"]:
        return [
            Finding(
                "model_class_differs",
                Severity.INFO,
                f"student {st['class']} and teacher {te['class']} share a vocabulary but not an architecture",
                [Evidence("manifest models", f"{st['class']} / {te['class']}")],
                "Usually fine; chat templates may still differ between the two.",
            )
        ]
    return []


def preflight_failures(rec: RunRecord) -> list[Finding]:
    out = []
    for check in _failed_checks(rec.preflight or {}):
        if check.split(".")[-1] in OWN_RULE_CHECKS:
            continue
        out.append(
            Finding(
                "preflight_failed",
                Severity.WARNING,
                f"preflight check failed: {check}",
                [Evidence("preflight.json", check)],
                "The pair was run despite a failing preflight check; its signal may be wrong.",
                advice="read preflight.json for the failing seam or template",
            )
        )
    return out


def pairing(rec: RunRecord) -> list[Finding]:
    return [
        *thinking(rec),
        *template(rec),
        *same_model(rec),
        *families(rec),
        *preflight_failures(rec),
    ]
