"""OPD's direction, through the real TRL-based trainer on tiny real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distill.config import OPDMethod, RunConfig
from distill.domains import build_domain
from distill.engines.hf import HFEngine
from distill.methods.context import RunContext
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog

pytestmark = pytest.mark.integration


def _context(
    tmp_path: Path,
    tiny_zoo,
    student: HFEngine,
    teacher: HFEngine,
    lr: float,
    loss: str = "token_reward_direct",
    top_k: int = 8,
    steps: int = 1,
) -> RunContext:
    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": OPDMethod(coef=1.0, loss=loss, top_k=top_k).model_dump(),
            "rollout": {"prompts_per_step": 4, "num_generations": 2, "max_new_tokens": 16},
            "optim": {"lr": lr, "max_steps": steps},
            "checkpoint": {"every_steps": 0},
            "seed": 3,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=build_domain(config.domain),
        student=student,
        teacher=teacher,
        log=StepLog(RunDir(run_dir), NullTracker()),
    )


def _step_metrics(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows[-1]


LOSSES = ["token_reward_direct", "k1", "k3", "forward_kl_topk", "jsd"]


@pytest.mark.parametrize("loss", LOSSES)
def test_student_equal_teacher_gives_zero_advantage_and_loss(tmp_path: Path, tiny_zoo, loss: str) -> None:
    from distill.methods.opd import train

    student = HFEngine.load(str(tiny_zoo.teacher))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    ctx = _context(tmp_path, tiny_zoo, student, teacher, lr=1e-3, loss=loss)
    before = {k: v.clone() for k, v in student.model.state_dict().items()}
    train(ctx)
    metrics = _step_metrics(ctx.run.path)
    assert metrics["student/completion_tokens_mean"] > 0
    assert abs(metrics["kl/reverse_kl_mean"]) < 1e-4
    assert abs(metrics["kl/advantage_mean"]) < 1e-4
    assert abs(metrics["train/loss"]) < 1e-4
    if loss != "token_reward_direct":
        # A divergence of ~1e-7 (float noise between two scoring layouts) still has a gradient that
        # Adam rescales to lr size: the weights are only pinned where the advantage is exactly 0.
        return
    # Zero advantage: the policy-gradient update leaves the weights where they were.
    after = ctx.student.model.state_dict()
    drift = max((after[k].float() - before[k].float()).abs().max().item() for k in before)
    assert drift < 1e-5


def _mean_logprob_of(engine: HFEngine, prompt_ids: list[list[int]], token: int) -> float:
    ids, mask = engine.left_pad(prompt_ids)
    with torch.no_grad():
        logits = engine.model(input_ids=ids, attention_mask=mask).logits[:, -1].float()
    return torch.log_softmax(logits, -1)[:, token].mean().item()


# jsd reads the teacher's head weights directly (TRL's chunked kernel), so a forward hook on the
# head cannot make it prefer a token; its direction is tested on the kernel in test_losses.py.
@pytest.mark.parametrize("loss", ["token_reward_direct", "k1", "k3", "forward_kl_topk"])
def test_teacher_preferring_a_token_raises_the_students_logprob_of_it(
    tmp_path: Path, tiny_zoo, loss: str
) -> None:
    from distill.methods.opd import train

    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.student))
    # A teacher that prefers token x: the same network with +4 on x's logit everywhere.
    x = teacher.tokenizer.convert_tokens_to_ids("7")
    assert isinstance(x, int) and x != teacher.tokenizer.unk_token_id

    def prefer_x(module, inputs, output):
        output = output.clone()
        output[..., x] += 4.0
        return output

    teacher.model.lm_head.register_forward_hook(prefer_x)
    # Adam's first step is lr * sign(grad) per weight; a few steps let the forward-KL variant's
    # gradient (spread over the teacher's top-k at every position) show its direction.
    steps = 3 if loss == "forward_kl_topk" else 1
    ctx = _context(tmp_path, tiny_zoo, student, teacher, lr=3e-2, loss=loss, top_k=4, steps=steps)
    probe = [student.prompt_ids(item.prompt) for item in ctx.domain.eval_items()[:8]]
    before = _mean_logprob_of(student, probe, x)
    train(ctx)
    metrics = _step_metrics(ctx.run.path)
    # Teacher logprobs of the student's own samples differ now, so the advantage is non-zero.
    assert metrics["kl/reverse_kl_mean"] != pytest.approx(0.0, abs=1e-3)
    after = _mean_logprob_of(ctx.student, probe, x)
    assert after > before + 0.05, (before, after)
