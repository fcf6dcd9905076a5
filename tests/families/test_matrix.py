"""The family matrix: real vocabularies, rows and templates, each pair x method through `distill run`.

A cell either runs its step(s) and logs what the method promises, or is refused before a run
directory exists with one line saying what differs and what to do. The cells that crashed before
issue 45: (a) a sampled id in the gap between tokenizer and embedding rows (the cross-family path,
and `cross_family=always`), (b) teacher top-k ids the student has no row for (forward_kl_topk),
(c) a sample the bridge cannot convert (masked and counted, not a crash). docs/models.md holds the
table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from families.conftest import METHOD_ARGS, SHORT, run_cli, train_steps

pytestmark = pytest.mark.integration


# (cell, student, teacher, method, overrides, metric every step must log)
RUNS = [
    *(
        pytest.param(
            f"qwen3-opd-{loss}",
            "s-qwen3",
            "t-qwen3",
            "opd",
            [f"method.loss={loss}"],
            "kl/reverse_kl_mean",
            id=f"qwen3-opd-{loss}",
        )
        # The three paths a loss takes: GRPO's policy gradient on advantages, a top-k divergence,
        # the full vocabulary. k1 and k3 share the sampled-token path (k3 runs cross-family below;
        # every loss on the tiny zoo: tests/e2e/test_on_policy.py).
        for loss in ("token_reward_direct", "forward_kl_topk", "jsd")
    ),
    pytest.param("qwen3-sft", "s-qwen3", "t-qwen3", "sft", [], "train/ce_loss", id="qwen3-sft"),
    pytest.param("qwen3-opsd", "s-qwen3", "s-qwen3", "opsd", [], "kl/reverse_kl_mean", id="qwen3-opsd"),
    pytest.param(
        "qwen25-opd-topk",
        "s-qwen25",
        "t-qwen25",
        "opd",
        ["method.loss=forward_kl_topk"],
        "kl/topk_overlap",
        id="qwen25-rows-opd-forward_kl_topk",
    ),
    pytest.param(
        "qwen25-opd-jsd",
        "s-qwen25",
        "t-qwen25",
        "opd",
        ["method.loss=jsd"],
        "kl/reverse_kl_mean",
        id="qwen25-rows-opd-jsd",
    ),
    pytest.param(
        "qwen15-opd-topk",
        "s-qwen15",
        "t-qwen15",
        "opd",
        ["method.loss=forward_kl_topk"],
        "kl/topk_overlap",
        id="qwen15-resized-opd-forward_kl_topk",
    ),
    pytest.param(
        "gpt2-rose", "s-qwen3", "t-gpt2-chat", "rose", [], "teacher/ce_target_share", id="gpt2-rose"
    ),
    pytest.param(
        "gpt2-template-file",
        "s-qwen3",
        "t-gpt2",
        "opd",
        ["method.loss=k3", "teacher.chat_template={template}"],
        "kl/aligned_share",
        id="gpt2-opd-teacher.chat_template",
    ),
    pytest.param(
        "llama3-opd-topk",
        "s-qwen3",
        "t-llama3",
        "opd",
        ["method.loss=forward_kl_topk"],
        "kl/topk_share",
        id="llama3-opd-forward_kl_topk",
    ),
    pytest.param("llama3-sft", "s-qwen3", "t-llama3", "sft", [], "train/ce_loss", id="llama3-sft"),
    pytest.param(
        "mistral-opd-topk",
        "s-qwen3",
        "t-mistral",
        "opd",
        ["method.loss=forward_kl_topk"],
        "kl/topk_share",
        id="mistral-opd-forward_kl_topk",
    ),
    pytest.param("mistral-sft", "s-qwen3", "t-mistral", "sft", [], "train/ce_loss", id="mistral-sft"),
    pytest.param(
        "gap-always",
        "s-qwen3-gap",
        "t-qwen3",
        "opd",
        ["method.loss=k3", "method.cross_family=always"],
        "bridge/seam_failure_rate",
        id="qwen3-gap-opd-cross_family=always",
    ),
]


@pytest.mark.parametrize(("cell", "student", "teacher", "method", "extra", "metric"), RUNS)
def test_cell_runs(
    cell: str,
    student: str,
    teacher: str,
    method: str,
    extra: list[str],
    metric: str,
    families: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = [e.format(template=families.gpt2_template) for e in extra]
    args = ["run", "--domain", "rlve", "--method", method, f"student.name={families[student]}"]
    args += [f"teacher.name={families[teacher]}", *SHORT, *METHOD_ARGS.get(method, []), *extra]
    result = run_cli([*args, f"tracking.run_name={cell}"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    (step,) = train_steps(tmp_path, cell)
    assert step["train/loss"] == step["train/loss"], step  # finite, not nan
    assert metric in step, sorted(step)


def test_cross_family_student_sampling_in_the_gap(
    families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's acceptance run: a Qwen3-vocabulary student (151,936 rows, random weights,
    temperature 1.0, its gap rows favoured) against GPT-2 (eos == pad, its user's template) with
    the top-k loss finishes its steps, the gap samples masked and counted, nothing raised."""
    args = ["run", "--domain", "rlve", "--method", "opd", f"student.name={families['s-qwen3-gap']}"]
    args += [
        f"teacher.name={families['t-gpt2-chat']}",
        *SHORT,
        "optim.max_steps=2",
        "method.loss=forward_kl_topk",
    ]
    result = run_cli([*args, "tracking.run_name=gap"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    steps = train_steps(tmp_path, "gap")
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert {"kl/aligned_share", "kl/topk_share", "bridge/seam_failure_rate"} <= set(step)
    # The gap ids are cut before the bridge (tokens the tokenizer cannot decode): counted as
    # out-of-vocabulary samples, never a crash.
    assert any(s.get("student/out_of_vocab_rate", 0) > 0 for s in steps)


def test_rose_from_a_sentencepiece_teacher(
    families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three ROSE steps from Mistral's sentencepiece vocabulary to Qwen3's: the teacher's
    continuation starts with `▁word` after the student's prefix, read and written in place
    (tokenizer_bridge/anchor.py), where it used to be refused as lossy before the run existed."""
    args = ["run", "--domain", "rlve", "--method", "rose", f"student.name={families['s-qwen3']}"]
    args += [f"teacher.name={families['t-mistral']}", *SHORT, *METHOD_ARGS["rose"], "optim.max_steps=3"]
    result = run_cli([*args, "tracking.run_name=mistral-rose"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    steps = train_steps(tmp_path, "mistral-rose")
    assert [s["step"] for s in steps] == [1, 2, 3]
    for step in steps:
        assert step["teacher/seam_failure_rate"] < 1.0 and step["train/ce_loss"] > 0, step
    # The anchors carried seams that would have gained or lost a space.
    assert sum(s["bridge/anchor_rescue_rate"] for s in steps) > 0


# (cell, student, teacher, method, overrides, the refusal's words)
REFUSALS = [
    pytest.param(
        "s-qwen3", "t-gpt2", "opd", [], "teacher.name: {t-gpt2} has no chat template", id="gpt2-no-template"
    ),
    pytest.param(
        "s-qwen3",
        "t-gpt2",
        "rose",
        ["teacher.chat_template={root}/nowhere.jinja"],
        "teacher.chat_template: no such file",
        id="gpt2-template-file-missing",
    ),
    pytest.param(
        "s-qwen3",
        "t-gpt2-chat",
        "opd",
        ["student.chat_template={root}"],
        "student.chat_template: no such file",
        id="template-is-a-folder",
    ),
]


@pytest.mark.parametrize(("student", "teacher", "method", "extra", "words"), REFUSALS)
def test_cell_refuses_before_a_run_directory(
    student: str,
    teacher: str,
    method: str,
    extra: list[str],
    words: str,
    families: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = {"{t-gpt2}": families["t-gpt2"], "{root}": str(families.root)}
    for key, value in names.items():
        extra = [e.replace(key, value) for e in extra]
        words = words.replace(key, value)
    args = ["run", "--domain", "rlve", "--method", method, f"student.name={families[student]}"]
    result = run_cli([*args, f"teacher.name={families[teacher]}", *SHORT, *extra], tmp_path, monkeypatch)
    assert result.exit_code == 2, result.output
    assert words in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "runs").exists()


def _preflight(families: Any, student: str, teacher: str, *extra: str) -> list[str]:
    """`distill run --preflight` of OPD on rlve with the pair `student` <- `teacher`."""
    pair = [f"student.name={families[student]}", f"teacher.name={families[teacher]}"]
    return ["run", "--preflight", "--domain", "rlve", "--method", "opd", *pair, *extra]


def test_cross_family_jsd_is_refused(families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jsd compares whole distributions over one vocabulary: a cross-family pair is told which
    losses it can use, and nothing is trained."""
    result = run_cli(_preflight(families, "s-qwen3", "t-llama3", "method.loss=jsd"), tmp_path, monkeypatch)
    assert result.exit_code != 0
    assert "method.loss=jsd" in result.output and "forward_kl_topk" in result.output, result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("teacher", "words"),
    [
        pytest.param("t-gpt2-chat", "aligned groups", id="gpt2"),
        pytest.param("t-mistral", "aligned groups", id="mistral"),
    ],
)
def test_preflight(
    teacher: str, words: str, families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_cli(_preflight(families, "s-qwen3", teacher), tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    assert words in result.output and "preflight passed" in result.output
    assert not (tmp_path / "runs").exists()


def test_preflight_refuses_a_thinking_only_teacher(
    families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same vocabulary, but the teacher's template (Qwen3-Thinking-2507) always opens `<think>`:
    it would score the student's tokens after a different prompt. Refused, with both prompts."""
    thinking = ("student.enable_thinking=true", "teacher.enable_thinking=true")
    result = run_cli(_preflight(families, "s-qwen3", "t-qwen3-thinking", *thinking), tmp_path, monkeypatch)
    assert result.exit_code == 2, result.output[-3000:]
    assert "chat templates differ" in result.output and "different prompt" in result.output
    assert not (tmp_path / "runs").exists()


def test_preflight_shows_rows_that_differ(
    families: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _preflight(families, "s-qwen15", "t-qwen15", "method.loss=forward_kl_topk")
    result = run_cli(args, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output[-3000:]
    assert "151,646" in result.output and "151,936" in result.output
