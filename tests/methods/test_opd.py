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
    temperature: float = 1.0,
) -> RunContext:
    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": OPDMethod(coef=1.0, loss=loss, top_k=top_k).model_dump(),
            "rollout": {
                "prompts_per_step": 4,
                "num_generations": 2,
                "max_new_tokens": 16,
                "temperature": temperature,
            },
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


# jsd's direction is tested on the chunked JSD in tests/kernels/test_losses.py.
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

    # A bias on the teacher's head: every scoring path reads the head's weight and bias (the
    # chunked head, kernels/heads.py), so this is the teacher's distribution wherever it is read.
    bias = torch.zeros(teacher.model.lm_head.out_features)
    # k3's value is clamped at 10 as verl's (kernels/losses.py): at +4 (ratio e^4, value 49) the clamp
    # binds where x is sampled and its gradient there is 0; +2 (value 4.4) stays inside it.
    bias[x] = 2.0 if loss == "k3" else 4.0
    teacher.model.lm_head.bias = torch.nn.Parameter(bias, requires_grad=False)
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


def _logprobs_at(model: torch.nn.Module, inputs: dict, temperature: float) -> torch.Tensor:
    """Completion-token logprobs from full logits at `temperature` (the plain reference)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    width_P = inputs["prompt_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, width_P - 1 : -1].float()
    logps = torch.log_softmax(logits / temperature, -1)
    return logps.gather(-1, inputs["completion_ids"][..., None])[..., 0]


@pytest.mark.parametrize("loss", ["token_reward_direct", "k1"])
def test_signal_scores_the_student_at_temperature_one(
    tmp_path: Path, tiny_zoo, loss: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rollouts sampled at 0.5; the distillation signal compares the two models as they are (both at
    temperature 1), never the tempered student with the untempered teacher (docs: OPD temperature)."""
    import copy

    from distill.kernels import losses
    from distill.methods.opd import train
    from distill.methods.signal import Signal

    student = HFEngine.load(str(tiny_zoo.student))
    frozen = copy.deepcopy(student.model)
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    seen: dict = {}
    real_set, real_kl, real_loss = Signal.set_advantages, losses.direct_kl_per_token, Signal.divergence_loss
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")

    # The batch as the loss sees it (GRPO shuffles the generated batch before the loss).
    def divergence_loss(self, step, model, head_model, inputs):  # type: ignore[no-untyped-def]
        seen["inputs"] = {k: inputs[k] for k in keys}
        return real_loss(self, step, model, head_model, inputs)

    def set_advantages(self, step, inputs, student_B_T):  # type: ignore[no-untyped-def]
        seen["inputs"] = {k: inputs[k] for k in keys}
        seen["student"] = student_B_T.detach().clone()
        return real_set(self, step, inputs, student_B_T)

    def direct_kl(name, logp_S_N, logp_T_N):  # type: ignore[no-untyped-def]
        seen["student_N"] = logp_S_N.detach().clone()
        return real_kl(name, logp_S_N, logp_T_N)

    monkeypatch.setattr(Signal, "divergence_loss", divergence_loss)
    monkeypatch.setattr(Signal, "set_advantages", set_advantages)
    monkeypatch.setattr(losses, "direct_kl_per_token", direct_kl)
    ctx = _context(tmp_path, tiny_zoo, student, teacher, lr=1e-3, loss=loss, temperature=0.5)
    train(ctx)
    inputs = seen["inputs"]
    mask = inputs["completion_mask"].bool()
    got = seen["student"][mask] if loss == "token_reward_direct" else seen["student_N"]
    at_one, at_half = (_logprobs_at(frozen, inputs, t)[mask] for t in (1.0, 0.5))
    torch.testing.assert_close(got, at_one, atol=1e-5, rtol=0)
    assert (got - at_half).abs().max() > 1e-2


def test_rollouts_are_sampled_as_generate_samples_them(tmp_path: Path, tiny_zoo, monkeypatch) -> None:
    """OPD's rollouts come from the lean batched sampler (engines/batched.py, TRL's `rollout_func`)
    where it applies; at a near-greedy temperature they are the completions TRL's `generate`
    samples, token for token."""
    from distill.methods import on_policy, opd
    from distill.methods.batch import Batches

    real_lean, real_targets = on_policy.LeanRollouts.__call__, Batches.targets
    used: list[bool] = []
    rows: dict[str, list[list[int]]] = {}

    def counted(self, prompts, trainer):  # type: ignore[no-untyped-def]
        used.append(True)
        return real_lean(self, prompts, trainer)

    def run(label: str) -> None:
        def capture(self, step, batch, teacher, perf):  # type: ignore[no-untyped-def]
            rows[label] = batch.completion_rows
            return real_targets(self, step, batch, teacher, perf)

        monkeypatch.setattr(Batches, "targets", capture)
        student, teacher = HFEngine.load(str(tiny_zoo.student)), HFEngine.load(str(tiny_zoo.teacher))
        (tmp_path / label).mkdir()
        opd.train(_context(tmp_path / label, tiny_zoo, student, teacher, 1e-3, temperature=1e-4))

    monkeypatch.setattr(on_policy.LeanRollouts, "__call__", counted)
    run("lean")
    assert used == [True]
    monkeypatch.setattr(on_policy, "lean_applies", lambda ctx: False)
    run("generate")
    assert used == [True]  # TRL's own generation this time
    assert len(rows["lean"]) == 8 and any(len(r) > 1 for r in rows["lean"])
    assert rows["lean"] == rows["generate"]
