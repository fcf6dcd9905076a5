"""Pairing rules read from the manifest and the model folders: the teacher being the student,
and two chat templates where the teacher scores the student's tokens."""

from __future__ import annotations

from pathlib import Path

from distill.diagnose import Severity, diagnose, load_run
from distill.diagnose.pairing import pairing, same_model, template, thinking

from .conftest import MakeRun
from .fake_runs import series_rows


def _model(folder: Path, template_text: str | None, vocab: int = 570) -> dict:
    folder.mkdir(parents=True)
    if template_text is not None:
        (folder / "chat_template.jinja").write_text(template_text)
    return {"path": str(folder), "class": "Qwen3ForCausalLM", "vocab": vocab}


def test_teacher_that_is_the_student(make_run: MakeRun, tmp_path: Path) -> None:
    student = _model(tmp_path / "student", "{{ x }}")
    make_run(
        "self",
        config={"student.name": "zoo:student", "teacher.name": "zoo:student"},
        manifest={"models": {"student": student, "teacher": student}},
        metrics=series_rows(10, kl__reverse_kl_mean=lambda s: 0.0),
    )
    [f] = same_model(load_run("self"))
    assert f.name == "teacher_is_student" and f.severity is Severity.ERROR
    assert [x.override for x in f.fixes] == ["teacher.name=zoo:teacher"]
    # Another path holding the same weights shows as a KL of exactly zero.
    teacher = _model(tmp_path / "copy", "{{ x }}")
    make_run(
        "copy",
        config={"teacher.name": str(tmp_path / "copy")},
        manifest={"models": {"student": student, "teacher": teacher}},
        metrics=series_rows(10, kl__reverse_kl_mean=lambda s: 0.0),
    )
    [f] = same_model(load_run("copy"))
    assert "reverse KL 0" in f.title
    # OPSD shares the weights by design; a real teacher has a signal.
    make_run("opsd", method={"name": "opsd"}, manifest={"models": {"student": student, "teacher": student}})
    assert same_model(load_run("opsd")) == []
    make_run(
        "real",
        manifest={"models": {"student": student, "teacher": teacher}},
        metrics=series_rows(10, kl__reverse_kl_mean=lambda s: 0.3),
    )
    assert same_model(load_run("real")) == []


def test_template_mismatch_without_preflight(make_run: MakeRun, tmp_path: Path) -> None:
    other = tmp_path / "other.jinja"
    other.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}")
    models = {
        "student": _model(tmp_path / "s", "{% for m in messages %}{{ m.content }}{% endfor %}"),
        "teacher": _model(tmp_path / "t", "{% for m in messages %}{{ m.content }}{% endfor %}"),
    }
    make_run(
        "tpl",
        config={"preflight": False, "teacher.chat_template": str(other)},
        manifest={"models": models},
    )
    [f] = template(load_run("tpl"))
    assert f.name == "template_mismatch" and f.severity is Severity.ERROR
    assert {e.source: e.note for e in f.evidence}["teacher template"] == "teacher.chat_template"
    # The student's folder template is what the rollouts used: the fix gives the teacher the same.
    assert [x.override for x in f.fixes] == [
        f"teacher.chat_template={tmp_path / 's' / 'chat_template.jinja'}"
    ]
    make_run("same", config={"preflight": False}, manifest={"models": models})
    assert template(load_run("same")) == []
    # Checked by the preflight and equal: nothing to say, whatever the texts.
    make_run(
        "checked",
        config={"teacher.chat_template": str(other)},
        manifest={"models": models},
        preflight={"checks": {"chat_template": {"ok": True, "detail": "token for token"}}},
    )
    assert template(load_run("checked")) == []


def test_template_failed_in_preflight_is_one_finding(make_run: MakeRun, tmp_path: Path) -> None:
    other = tmp_path / "other.jinja"
    other.write_text("x")
    make_run(
        "refused",
        config={"student.chat_template": str(other)},
        summary={"status": "FAILED", "error": "PreflightError: chat templates differ"},
        preflight={"checks": {"chat_template": {"ok": False, "detail": "chat templates differ: ..."}}},
    )
    rec = load_run("refused")
    names = [f.name for f in pairing(rec)]
    assert names == ["template_mismatch"]
    [f] = [x for x in diagnose(rec) if x.name == "template_mismatch"]
    assert [x.override for x in f.fixes] == [f"teacher.chat_template={other}"]
    assert {"run_failed", "template_mismatch"} <= {x.name for x in diagnose(rec)}


def test_thinking_is_compared_with_each_domains_teacher(make_run: MakeRun) -> None:
    # A run with a teacher per domain: `teacher` is a placeholder nothing renders with.
    mix = {"domain.name": "rlve+dapo", "student.enable_thinking": False}

    def teachers(rlve: bool | None, dapo: bool | None) -> dict:
        return {
            "teachers": {
                "rlve": {"name": "zoo:teacher", "enable_thinking": rlve},
                "dapo": {"name": "zoo:teacher-llama", "enable_thinking": dapo},
            }
        }

    make_run("agree", config={**mix, **teachers(False, False)})
    assert thinking(load_run("agree")) == []  # the placeholder's None is not compared
    make_run("dapo-thinks", config={**mix, **teachers(False, True)})
    [f] = thinking(load_run("dapo-thinks"))
    assert (f.name, f.severity) == ("thinking_mismatch:dapo", Severity.ERROR)
    assert "dapo's teacher True" in f.title
    assert [x.override for x in f.fixes] == ["teachers.dapo.enable_thinking=false"]
    # One side the family's default: a warning, the fix on the side that was set.
    make_run("default", config={**mix, "student.enable_thinking": None, **teachers(None, True)})
    [f] = thinking(load_run("default"))
    assert (f.name, f.severity) == ("thinking_mismatch:dapo", Severity.WARNING)
    assert [x.override for x in f.fixes] == ["student.enable_thinking=true"]
    # One domain, one teacher: as before.
    make_run("one", config={"student.enable_thinking": True, "teacher.enable_thinking": False})
    [f] = thinking(load_run("one"))
    assert f.name == "thinking_mismatch" and f.fixes[0].override == "teacher.enable_thinking=true"
