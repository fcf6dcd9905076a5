"""OPSD on the real trainer: privileged teacher prompts, teacher weights, LoRA checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distill.config import RunConfig
from distill.domains import build_domain
from distill.engines.hf import HFEngine
from distill.methods.context import RunContext
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog

pytestmark = pytest.mark.integration


def _context(tmp_path: Path, tiny_zoo, method: dict, **extra: object) -> RunContext:
    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": {"name": "opsd", **method},
            "student": {"name": str(tiny_zoo.student)},
            "rollout": {"prompts_per_step": 4, "num_generations": 2, "max_new_tokens": 16},
            "optim": {"lr": 1e-2, "max_steps": 2},
            "checkpoint": {"every_steps": 2},
            "seed": 5,
            **extra,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    return RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=build_domain(config.domain),
        student=HFEngine.load(str(tiny_zoo.student)),
        teacher=HFEngine.load(str(tiny_zoo.student)),
        log=StepLog(RunDir(run_dir), NullTracker()),
    )


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_teacher_message_uses_the_worked_solution(tiny_zoo) -> None:
    from pydantic import ValidationError

    from distill.config import OPSDMethod
    from distill.methods.views import teacher_message

    domain = build_domain(tiny_zoo.domain)
    item = domain.train_items()[0]
    text = teacher_message(OPSDMethod(), domain, item)
    assert item.prompt.strip() in text and item.solution and item.solution.strip() in text
    assert "=== Reference Solution Begin ===" in text
    # An unknown placeholder is a config error, before any run exists.
    with pytest.raises(ValidationError, match="unknown placeholder 'answer_key'"):
        OPSDMethod(teacher_template="{problem} {answer_key}")


def test_base_teacher_stays_frozen_while_the_student_moves(tmp_path: Path, tiny_zoo) -> None:
    from distill.methods.opsd import train

    ctx = _context(tmp_path, tiny_zoo, {"teacher_weights": "base"})
    teacher_before = {k: v.clone() for k, v in ctx.teacher.model.state_dict().items()}
    student_before = {k: v.clone() for k, v in ctx.student.model.state_dict().items()}
    train(ctx)
    rows = [r for r in _rows(ctx.run.path) if "train/loss" in r]
    assert len(rows) == 2 and all(abs(r["kl/reverse_kl_mean"]) > 1e-4 for r in rows)
    teacher_after, student_after = ctx.teacher.model.state_dict(), ctx.student.model.state_dict()
    assert all(torch.equal(teacher_before[k], teacher_after[k]) for k in teacher_before)
    assert any(not torch.equal(student_before[k], student_after[k]) for k in student_before)


def test_ema_teacher_follows_the_student_partially(tmp_path: Path, tiny_zoo) -> None:
    from distill.methods.opsd import train

    ctx = _context(tmp_path, tiny_zoo, {"teacher_weights": "ema", "ema_decay": 0.5})
    name = "model.embed_tokens.weight"
    start = ctx.teacher.model.state_dict()[name].clone()
    train(ctx)
    teacher, student = ctx.teacher.model.state_dict()[name], ctx.student.model.state_dict()[name]
    assert not torch.equal(teacher, start)
    # Between where it started and where the student went.
    assert (teacher - start).norm() < (student - start).norm()


def test_ema_teacher_is_saved_with_each_checkpoint_and_restored_on_resume(tmp_path: Path, tiny_zoo) -> None:
    """The EMA teacher is state the Trainer does not keep: it goes into every checkpoint, and a run
    resumed from step 1 continues with that teacher, ending where the uninterrupted run ended."""
    import shutil

    from safetensors.torch import load_file

    from distill.methods.opsd import train
    from distill.methods.privileged import EMA_FILE

    method = {"teacher_weights": "ema", "ema_decay": 0.5}
    full = _context(tmp_path / "full", tiny_zoo, method, checkpoint={"every_steps": 1})
    train(full)
    ckpts = full.run.path / "checkpoints"
    final_teacher = load_file(ckpts / "step-2" / EMA_FILE)
    live = full.teacher.model.state_dict()
    assert final_teacher and all(torch.equal(live[k], v) for k, v in final_teacher.items())
    assert not torch.equal(
        load_file(ckpts / "step-1" / EMA_FILE)["model.norm.weight"], live["model.norm.weight"]
    )

    resumed = _context(tmp_path / "resumed", tiny_zoo, method, checkpoint={"every_steps": 1})
    shutil.copytree(ckpts / "step-1", resumed.run.path / "checkpoints" / "step-1")
    resumed.resume_from = resumed.run.path / "checkpoints" / "step-1"
    train(resumed)
    teacher, student = resumed.teacher.model.state_dict(), resumed.student.model.state_dict()
    assert all(torch.equal(teacher[k], v) for k, v in final_teacher.items())
    assert all(torch.equal(student[k], v) for k, v in full.student.model.state_dict().items())

    shutil.rmtree(resumed.run.path / "checkpoints")
    shutil.copytree(ckpts / "step-1", resumed.run.path / "checkpoints" / "step-1")
    (resumed.run.path / "checkpoints" / "step-1" / EMA_FILE).unlink()  # a checkpoint from before
    with pytest.raises(ValueError, match="has no ema_teacher.safetensors"):
        train(resumed)


def test_lora_student_saves_adapters_that_load_merged(tmp_path: Path, tiny_zoo) -> None:
    from distill.methods.opsd import train

    ctx = _context(
        tmp_path, tiny_zoo, {"teacher_weights": "base"}, lora={"enabled": True, "rank": 4, "alpha": 8}
    )
    train(ctx)
    ckpt = ctx.run.path / "checkpoints" / "checkpoint-2"
    if not ckpt.exists():  # DistillCallback renames complete checkpoints
        ckpt = ctx.run.path / "checkpoints" / "step-2"
    assert (ckpt / "adapter_config.json").exists()
    loaded = HFEngine.load(str(ckpt))
    ids = torch.tensor([ctx.student.prompt_ids(ctx.domain.eval_items()[0].prompt)])
    with torch.no_grad():
        want = ctx.student.model(input_ids=ids).logits
        got = loaded.model(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    base = HFEngine.load(str(tiny_zoo.student))
    with torch.no_grad():
        assert not torch.allclose(base.model(input_ids=ids).logits, got, atol=1e-4)
