"""Preflight on real tiny models: matching pairs pass, a mismatched chat template or thinking mode fails."""

from __future__ import annotations

import pytest
import torch

from distill.config import RunConfig
from distill.domains import build_domain
from distill.engines.hf import HFEngine
from distill.methods.preflight import (
    PreflightError,
    check_loss_mask,
    reference_check,
    run_preflight,
    side_by_side,
)
from distill.methods.views import teacher_view

pytestmark = pytest.mark.integration


def _config(tiny_zoo, method: str = "opd", **model: object) -> RunConfig:
    data: dict[str, object] = {
        "domain": tiny_zoo.domain.model_dump(),
        "method": {"name": method},
        "student": {"name": str(tiny_zoo.student), **model},
    }
    if method != "opsd":  # opsd's teacher is the student itself
        data["teacher"] = {"name": str(tiny_zoo.teacher), **model}
    return RunConfig.model_validate(data)


def _run(config: RunConfig, student: HFEngine, teacher: HFEngine):
    domain = build_domain(config.domain)
    view = teacher_view(config, domain)
    assert view is not None
    return run_preflight(
        config, student, teacher, domain.train_items()[:2], view.prompt_for, view.same_template
    )


def test_matching_pair_passes_with_zero_self_score_gap(tiny_zoo) -> None:
    config = _config(tiny_zoo)
    report = _run(config, HFEngine.load(str(tiny_zoo.student)), HFEngine.load(str(tiny_zoo.teacher)))
    names = [name for name, _ in report.checks]
    assert names == ["thinking mode", "chat template", "self-score"]
    assert "student and teacher prompts are identical" in report.side_by_side


def test_mismatched_chat_template_is_caught_and_shown(tiny_zoo) -> None:
    config = _config(tiny_zoo)
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    # The teacher's template quietly adds a system turn: the bug that sinks OPD reproductions.
    template = teacher.tokenizer.chat_template
    assert isinstance(template, str)
    teacher.tokenizer.chat_template = "<|im_start|>system\nYou are a teacher.<|im_end|>\n" + template
    with pytest.raises(PreflightError, match="chat templates differ") as err:
        _run(config, student, teacher)
    assert " !" in str(err.value)  # the differing rows are marked


def test_thinking_mode_disagreement_refuses_to_start(tiny_zoo) -> None:
    config = _config(tiny_zoo)
    config.student.enable_thinking = True
    config.teacher.enable_thinking = False
    with pytest.raises(PreflightError, match="thinking mode differs") as err:
        _run(
            config,
            HFEngine.load(str(tiny_zoo.student), enable_thinking=True),
            HFEngine.load(str(tiny_zoo.teacher), enable_thinking=False),
        )
    assert "student (enable_thinking=True)" in str(err.value)


def test_opsd_teacher_prompt_carries_the_privileged_solution(tiny_zoo) -> None:
    config = _config(tiny_zoo, method="opsd")
    assert config.teacher.name == config.student.name
    engine = HFEngine.load(str(tiny_zoo.student))
    report = _run(config, engine, HFEngine.load(str(tiny_zoo.student)))
    assert "self-score" in [name for name, _ in report.checks]
    # The privileged prompt is longer than the student's and differs from the first user token on.
    assert any(line.startswith(" !") for line in report.side_by_side.splitlines())


def test_loss_mask_check_rejects_signal_on_padding() -> None:
    prompt = torch.tensor([[0, 5, 6, 7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    completion = torch.tensor([[3, 4, 2, 0]])
    completion_mask = torch.tensor([[1, 1, 1, 0]])
    ok = torch.tensor([[0.5, -0.2, 0.1, 0.0]])
    check_loss_mask(prompt, prompt_mask, completion, completion_mask, ok, [[5, 6, 7, 8, 9]])
    with pytest.raises(PreflightError, match="padding"):
        check_loss_mask(
            prompt,
            prompt_mask,
            completion,
            completion_mask,
            torch.tensor([[0.5, 0, 0, 0.3]]),
            [[5, 6, 7, 8, 9]],
        )
    with pytest.raises(PreflightError, match="gap"):
        check_loss_mask(
            prompt,
            prompt_mask,
            completion,
            torch.tensor([[1, 0, 1, 0]]),
            torch.zeros(1, 4),
            [[5, 6, 7, 8, 9]],
        )
    with pytest.raises(PreflightError, match="repeats its prompt"):
        check_loss_mask(
            prompt,
            prompt_mask,
            torch.tensor([[5, 6, 7, 8, 9, 1]]),
            torch.ones(1, 6),
            torch.zeros(1, 6),
            [[5, 6, 7, 8, 9]],
        )


def test_side_by_side_marks_only_differing_rows() -> None:
    table = side_by_side(("a", ["x", "y", "z"]), ("b", ["x", "q"]))
    marks = [line[1] for line in table.splitlines()[1:]]
    assert marks == [" ", "!", "!"]


def test_a_run_over_several_domains_keeps_each_domains_report(tiny_zoo, tmp_path) -> None:
    from distill.diagnose.records import load_run
    from distill.prepare import preflight
    from distill.tracking.rundir import RunDir

    # dapo's teacher opens a think block the student does not: its check fails after rlve's passed.
    config = RunConfig.model_validate(
        {
            "domain": {
                "name": "rlve+dapo",
                "parts": {"rlve": tiny_zoo.domain.model_dump(), "dapo": {"train_size": 8, "eval_size": 4}},
            },
            "method": {"name": "opd"},
            "student": {"name": str(tiny_zoo.student), "enable_thinking": False},
            "teachers": {
                "rlve": {"name": str(tiny_zoo.teacher), "enable_thinking": False},
                "dapo": {"name": str(tiny_zoo.teacher), "enable_thinking": True},
            },
        }
    )
    domain = build_domain(config.domain)
    student = HFEngine.load(str(tiny_zoo.student), enable_thinking=False)
    teachers = {
        "rlve": HFEngine.load(str(tiny_zoo.teacher), enable_thinking=False),
        "dapo": HFEngine.load(str(tiny_zoo.teacher), enable_thinking=True),
    }
    run = RunDir(tmp_path / "mixed")
    run.path.mkdir()
    try:
        with pytest.raises(PreflightError, match="thinking mode differs"):
            preflight(config, domain, student, teachers["rlve"], lambda _: None, run, teachers)
    finally:
        domain.close()
    kept = run.read_preflight()
    assert set(kept["parts"]) == {"rlve", "dapo"}
    assert kept["parts"]["rlve"]["checks"]["thinking_mode"]["ok"] is True
    assert kept["parts"]["dapo"]["checks"]["thinking_mode"]["ok"] is False
    # diagnose reads the check from the domain where it failed.
    (run.path / "summary.json").write_text('{"run_id": "mixed"}')
    (run.path / "config.yaml").write_text(config.model_dump_json())
    check = load_run(run.path).preflight_check("thinking_mode")
    assert check is not None and check["ok"] is False and check["detail"].startswith("dapo: thinking mode")


def test_the_teacher_reference_gap_is_kept_passed_or_failed(tiny_zoo) -> None:
    # What diagnose's teacher_reference_gap reads: the measured gap, in preflight.json.
    config = _config(tiny_zoo)
    student, teacher = HFEngine.load(str(tiny_zoo.student)), HFEngine.load(str(tiny_zoo.teacher))
    items = build_domain(config.domain).train_items()[:2]
    for reference, ok in ((teacher, True), (student, False)):  # the same weights; another model
        report = _run(config, student, teacher)

        def check(r: HFEngine = reference, into=report) -> str:
            return reference_check(teacher, r, student, items, into)

        try:
            report.run("teacher reference", check)
        except PreflightError:
            pass
        kept = report.to_json()["checks"]["teacher_reference"]
        assert kept["ok"] is ok
        assert kept["value"] == pytest.approx(0.0, abs=1e-5) if ok else kept["value"] >= 1.0
