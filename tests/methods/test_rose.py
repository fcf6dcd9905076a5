"""ROSE on tiny real models: the loss mask, the budget accounting, the direction, cross-family."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from distill.config import ROSEMethod, RunConfig
from distill.domains import build_domain
from distill.engines.hf import HFEngine
from distill.methods.context import RunContext
from distill.methods.online import collate
from distill.methods.rose import Rollout, draw_prefix_len, rose_example, teacher_continuations
from distill.tokenizer_bridge.bridge import TokenizerBridge
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog

METRICS = (
    "train/ce_loss",
    "teacher/ce_target_tokens_mean",
    "teacher/ce_target_tokens_max",
    "teacher/ce_target_share",
    "teacher/truncation_rate",
    "student/prefix_tokens_mean",
    "student/completion_tokens_mean",
    "student/completion_tokens_max",
    "student/truncation_rate",
    "coverage/supervised_share",
)


def _context(
    tmp_path: Path, tiny_zoo: Any, student: HFEngine, teacher: HFEngine, lr: float = 1e-3, **method: Any
) -> RunContext:
    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": ROSEMethod(**method).model_dump(),
            "rollout": {"prompts_per_step": 4, "num_generations": 2, "max_new_tokens": 24},
            "optim": {"lr": lr, "max_steps": 1},
            "checkpoint": {"every_steps": 0},
            "seed": 5,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    return RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=build_domain(config.domain),
        student=student,
        teacher=teacher,
        log=StepLog(RunDir(run_dir), NullTracker()),
    )


def _train_one_step(ctx: RunContext) -> dict[str, float]:
    from distill.methods.rose import train

    train(ctx)
    rows = [json.loads(line) for line in (ctx.run.path / "metrics.jsonl").read_text().splitlines()]
    return rows[-1]


@contextmanager
def stops_after(engine: HFEngine, n: int) -> Iterator[None]:
    """The engine's model writes EOS as its n-th new token of every generate() call."""
    eos = engine.tokenizer.eos_token_id
    calls = {"n": 0}

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] < n:
            return output
        output = output.clone()
        output[..., eos] += 1e4
        return output

    original = engine.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        calls["n"] = 0  # one forward per new token (KV cache): count from this call's first
        return original(*args, **kwargs)

    handle = engine.model.lm_head.register_forward_hook(hook)
    engine.generate = generate  # type: ignore[method-assign]
    try:
        yield
    finally:
        handle.remove()
        del engine.generate


def test_prefix_length_fixed_range_fraction_and_capped() -> None:
    rng = random.Random(0)
    assert draw_prefix_len(ROSEMethod(prefix_tokens=8, prefix_tokens_min=None), 30, rng) == 8
    assert draw_prefix_len(ROSEMethod(prefix_tokens=8, prefix_tokens_min=None), 5, rng) == 5
    drawn = {draw_prefix_len(ROSEMethod(prefix_tokens=8, prefix_tokens_min=2), 30, rng) for _ in range(200)}
    assert drawn == set(range(2, 9))
    # The range is capped at the student's own response: never past where it stopped.
    capped = {draw_prefix_len(ROSEMethod(prefix_tokens=64, prefix_tokens_min=0), 6, rng) for _ in range(200)}
    assert capped == set(range(7))
    assert draw_prefix_len(ROSEMethod(prefix_fraction=0.5), 30, rng) == 15
    assert draw_prefix_len(ROSEMethod(prefix_fraction=1.0), 30, rng) == 30


def test_draws_are_a_function_of_seed_step_and_micro_batch() -> None:
    """ROSE keeps no RNG state of its own: a micro-batch's K draws come from (run seed, step,
    micro-batch index), so each gradient-accumulation micro-batch draws its own and a resumed run
    (a fresh trainer at the checkpoint's step) draws what the uninterrupted one drew there. Its
    sampled tokens use torch's stream, which the Trainer's checkpoint restores
    (tests/e2e/test_kill_resume.py checks the whole resumed run bit for bit)."""
    from distill.methods.online import MicroBatches

    def trainer(seed: int) -> MicroBatches:
        return MicroBatches(seed)  # what a trainer's draws depend on: the run's seed and the step

    def step_draws(t: MicroBatches, step: int, micro_batches: int = 2) -> list[list[int]]:
        draws = []
        for _ in range(micro_batches):
            t.begin(step)
            rng = t.rng()
            draws.append([draw_prefix_len(ROSEMethod(prefix_tokens=64), 60, rng) for _ in range(8)])
        return draws

    uninterrupted = trainer(5)
    seen = [step_draws(uninterrupted, step) for step in range(4)]
    first, second = seen[3]
    assert first != second  # the micro-batches of one step draw differently
    assert step_draws(trainer(5), 3) == seen[3]  # resumed at step 3: the same draws
    assert step_draws(trainer(6), 3) != seen[3] and seen[2] != seen[3]


def test_config_rejects_an_inverted_range() -> None:
    from distill.config import ConfigError, resolve_config

    with pytest.raises(ConfigError, match="prefix_tokens_min"):
        resolve_config("rlve", "rose", None, ["method.prefix_tokens=4", "method.prefix_tokens_min=8"])
    cfg = resolve_config("rlve", "rose", None, [])
    assert cfg.method.name == "rose" and cfg.rollout.prompts_per_step == 16 and cfg.optim.max_steps == 200


def test_loss_mask_gradients_flow_only_from_teacher_tokens(tiny_zoo: Any) -> None:
    engine = HFEngine.load(str(tiny_zoo.student))
    model = engine.model
    tok = engine.tokenizer
    prompt = engine.prompt_ids("What is 3 times 4?")
    prefix = engine.encode("3 * 4: 4,")
    target = engine.encode(" 8, 12.\n\\boxed{12}") + [tok.eos_token_id]

    def loss_of(labels_from: tuple[list[int], list[int], list[int]]) -> torch.Tensor:
        ids, _ = rose_example(prompt, prefix, target)
        _, labels = rose_example(*labels_from)
        batch = collate([(ids, labels)], tok.pad_token_id)
        return model(**batch).loss

    base = loss_of((prompt, prefix, target))
    # Other tokens in the prompt/prefix label slots: nothing changes (they are never targets).
    shuffled = (prompt[::-1], [(t + 7) % len(tok) for t in prefix], target)
    assert loss_of(shuffled).item() == base.item()
    # One teacher token changed: the loss changes.
    changed = list(target)
    changed[2] = (changed[2] + 1) % len(tok)
    assert abs(loss_of((prompt, prefix, changed)).item() - base.item()) > 1e-4

    # d loss / d logits: zero at every position that predicts a prompt or prefix token.
    ids, labels = rose_example(prompt, prefix, target)
    batch = collate([(ids, labels)], tok.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = model.loss_function(logits=logits, labels=batch["labels"], vocab_size=model.config.vocab_size)
    assert torch.allclose(loss, base)
    (grad_T_V,) = torch.autograd.grad(loss, logits)
    per_position = grad_T_V[0].abs().sum(-1)
    first_target = len(prompt) + len(prefix)
    # Position p predicts token p + 1.
    assert per_position[: first_target - 1].abs().max().item() == 0.0
    assert (per_position[first_target - 1 : len(ids) - 1] > 0).all()
    assert per_position[len(ids) - 1].item() == 0.0


@pytest.mark.integration
def test_budget_accounting_shows_truncation_and_generous_budget_clears_it(
    tmp_path: Path, tiny_zoo: Any
) -> None:
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    # A teacher whose continuation takes 12 tokens (EOS included).
    with stops_after(teacher, 12):
        tight = _train_one_step(
            _context(
                tmp_path / "t2",
                tiny_zoo,
                student,
                teacher,
                prefix_tokens=2,
                prefix_tokens_min=None,
                teacher_max_tokens=2,
            )
        )
        generous = _train_one_step(
            _context(
                tmp_path / "t64",
                tiny_zoo,
                HFEngine.load(str(tiny_zoo.student)),
                teacher,
                prefix_tokens=2,
                prefix_tokens_min=None,
                teacher_max_tokens=64,
            )
        )
    for key in METRICS:
        assert key in tight and key in generous, key
    assert tight["teacher/ce_target_share"] >= 0.94
    assert tight["teacher/truncation_rate"] >= 0.9
    assert tight["teacher/ce_target_tokens_max"] == 2
    assert generous["teacher/ce_target_share"] <= 0.25
    assert generous["teacher/truncation_rate"] <= 0.1
    assert generous["teacher/ce_target_tokens_mean"] == pytest.approx(12)
    assert tight["student/prefix_tokens_mean"] <= 2
    # Coverage: supervised tokens over the student's full response length on the same prompts.
    assert generous["coverage/supervised_share"] > tight["coverage/supervised_share"] > 0


@pytest.mark.integration
def test_samples_show_prefix_continuation_and_mask(tmp_path: Path, tiny_zoo: Any) -> None:
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    with stops_after(teacher, 6):
        ctx = _context(tmp_path, tiny_zoo, student, teacher, prefix_tokens=3, prefix_tokens_min=None)
        _train_one_step(ctx)
    rows = [json.loads(line) for line in (ctx.run.path / "samples" / "step-1.jsonl").read_text().splitlines()]
    assert len(rows) == ctx.config.tracking.sample_rows
    for row in rows:
        assert row["prompt"] and "student_prefix" in row and "teacher_continuation" in row
        assert row["mask"] == [0] * row["prefix_tokens"] + [1] * row["target_student_tokens"]
        assert row["teacher_tokens"] == 6 and not row["teacher_truncated"]
        assert row["teacher_continuation"].endswith(teacher.tokenizer.eos_token)


@pytest.mark.integration
def test_student_moves_toward_the_teachers_continuation(tmp_path: Path, tiny_zoo: Any) -> None:
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.student))
    x = teacher.tokenizer.convert_tokens_to_ids("7")

    def prefer_x(module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., x] += 6.0
        return output

    teacher.model.lm_head.register_forward_hook(prefer_x)
    ctx = _context(tmp_path, tiny_zoo, student, teacher, teacher_max_tokens=8, lr=3e-2)
    probe = [student.prompt_ids(item.prompt) for item in ctx.domain.eval_items()[:8]]

    def mean_logprob_of_x() -> float:
        ids, mask = student.left_pad(probe)
        with torch.no_grad():
            logits = student.model(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        return torch.log_softmax(logits, -1)[:, x].mean().item()

    before = mean_logprob_of_x()
    metrics = _train_one_step(ctx)
    assert metrics["train/ce_loss"] > 0
    assert mean_logprob_of_x() > before + 0.05


@pytest.mark.integration
def test_teacher_continues_the_students_think_block_without_reopening(tiny_zoo: Any, tmp_path: Path) -> None:
    # enable_thinking=False: the qwen template writes an empty think block into the prompt.
    teacher = HFEngine.load(str(tiny_zoo.teacher), enable_thinking=False)
    student = HFEngine.load(str(tiny_zoo.student))
    think = teacher.tokenizer.convert_tokens_to_ids("<think>")

    def prefer_think(module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., think] += 50.0
        return output

    teacher.model.lm_head.register_forward_hook(prefer_think)
    ctx = _context(tmp_path, tiny_zoo, student, teacher, teacher_max_tokens=4)
    item = ctx.domain.train_items()[0]
    bridge = TokenizerBridge(student.tokenizer, teacher.tokenizer)
    prompt = student.prompt_ids(item.prompt)
    prefix = student.encode("<think>\nsmallest")
    rollouts = [
        Rollout(item, prompt, prefix, False, "", prefix_ids=prefix, prefix_text="<think>\nsmallest"),
        Rollout(item, prompt, [], False, "", prefix_ids=[], prefix_text=""),
    ]
    teacher_continuations(ctx, bridge, rollouts)
    opened, fresh = rollouts
    assert opened.teacher_ids and think not in opened.teacher_ids
    # Without a student think block the teacher may open one (here it is pushed to).
    assert fresh.teacher_ids[0] == think
    # The teacher's prompt for the opened block carries no think block of its own.
    from distill.tokenizer_bridge.thinking import teacher_prompt_ids

    with_block = teacher.tokenizer.decode(teacher.prompt_ids(item.prompt))
    without = teacher.tokenizer.decode(teacher_prompt_ids(teacher, item.prompt, "<think>\nsmallest"))
    assert with_block.endswith("<think>\n\n</think>\n\n") and without.endswith("<|im_start|>assistant\n")


@pytest.mark.integration
def test_cross_family_step_goes_through_the_bridge(tmp_path: Path, tiny_zoo: Any) -> None:
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher_llama))
    assert not TokenizerBridge(student.tokenizer, teacher.tokenizer).same
    with stops_after(teacher, 10):
        ctx = _context(tmp_path, tiny_zoo, student, teacher, teacher_max_tokens=16)
        metrics = _train_one_step(ctx)
    assert metrics["teacher/seam_failure_rate"] == 0.0
    assert metrics["teacher/truncation_rate"] == 0.0 and metrics["teacher/ce_target_tokens_max"] <= 10
    rows = [json.loads(line) for line in (ctx.run.path / "samples" / "step-1.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["seam_ok"]
        # Counted in both tokenizers: t is the teacher's budget, the mask is over student tokens.
        assert 1 <= row["teacher_tokens"] <= 10 and row["target_student_tokens"] >= 1
        assert len(row["mask"]) == row["prefix_tokens"] + row["target_student_tokens"]
        # The teacher's end of turn crossed as the student's, never as literal text.
        assert row["teacher_continuation"].endswith(student.tokenizer.eos_token)
        assert "<|eot_id|>" not in row["teacher_continuation"]


@pytest.mark.integration
def test_distill_run_rose_cross_family_end_to_end(tmp_path: Path, tiny_zoo: Any) -> None:
    d = tiny_zoo.domain
    env = {**os.environ, "DISTILL_WORKSPACE": str(tmp_path / "ws"), "OMP_NUM_THREADS": "1"}
    args = [
        "run",
        "--domain",
        "rlve",
        "--method",
        "rose",
        "--student",
        str(tiny_zoo.student),
        "--teacher",
        str(tiny_zoo.teacher_llama),
        f"domain.train_size={d.train_size}",
        f"domain.eval_size={d.eval_size}",
        "optim.max_steps=2",
        "checkpoint.every_steps=1",
        "rollout.prompts_per_step=2",
        "rollout.max_new_tokens=16",
        "method.teacher_max_tokens=8",
        "eval.items=4",
        "eval.max_new_tokens=16",
        "threads=1",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "ws" / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "FINISHED"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in steps if "train/ce_loss" in row]
    assert [row["step"] for row in trained] == [1, 2]
    assert all(key in trained[-1] for key in METRICS + ("teacher/seam_failure_rate",))
    assert (run_dir / "samples" / "step-2.jsonl").exists()
    assert (run_dir / "checkpoints" / "step-1").is_dir() and (run_dir / "checkpoints" / "step-2").is_dir()
