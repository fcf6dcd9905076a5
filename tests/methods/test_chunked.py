"""Every scoring and loss path through the chunked head equals its full-logits form, value and
gradient, to 1e-5 on the zoo pair (the forms the code had before it was chunked)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distill.config import OPDMethod, Sampling
from distill.engines.base import right_pad
from distill.engines.hf import HFEngine
from distill.kernels import losses
from distill.methods.scoring import token_advantages
from distill.methods.signal import Signal
from distill.tracking.base import NullTracker
from distill.tracking.steplog import SilentLog

TOL = 1e-5


@pytest.fixture(scope="module")
def pair(tiny_zoo: Any) -> tuple[HFEngine, HFEngine]:
    torch.manual_seed(0)
    return HFEngine.load(str(tiny_zoo.student)), HFEngine.load(str(tiny_zoo.teacher))


@pytest.fixture(scope="module")
def rollout(pair: tuple[HFEngine, HFEngine]) -> dict[str, Any]:
    """Three sampled completions of different lengths, in the on-policy trainer's layout."""
    student, _ = pair
    torch.manual_seed(1)
    prompts = [student.prompt_ids(p) for p in ("What is 3 times 4?", "Sort: 3 1 2", "hi")]
    completions = [c.ids for c in student.generate(prompts, Sampling(12, 1.0))]
    completions[2] = completions[2][:4]
    prompt_ids, prompt_mask = student.left_pad(prompts)
    comp_ids, comp_mask = right_pad(completions, int(student.tokenizer.pad_token_id))
    return {
        "prompts": prompts,
        "completions": completions,
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": comp_ids,
        "completion_mask": comp_mask,
    }


def full_logprobs(model: Any, batch: dict[str, Any], temperature: float = 1.0) -> torch.Tensor:
    """[B, T, V] log-softmax at the completion positions: the unchunked reference."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width_P, width_T = batch["prompt_ids"].shape[1], batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=mask).logits[:, width_P - 1 : width_P - 1 + width_T]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def grads(model: Any) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, atol=TOL, rtol=1e-4), (x - y).abs().max()


def test_engine_scores_equal_the_full_logits(
    pair: tuple[HFEngine, HFEngine], rollout: dict[str, Any]
) -> None:
    _, teacher = pair
    scores = teacher.score(rollout["prompts"], rollout["completions"], top_k=5)
    with torch.no_grad():
        ref_B_T_V = full_logprobs(teacher.model, rollout)
    mask = rollout["completion_mask"].bool()
    sampled = ref_B_T_V.gather(-1, rollout["completion_ids"][..., None])[..., 0]
    assert torch.allclose(scores.logprobs_B_T[mask], sampled[mask], atol=TOL)
    ids, logps = scores.topk()
    top = ref_B_T_V.topk(5, dim=-1)
    assert torch.equal(ids[mask], top.indices[mask])
    assert torch.allclose(logps[mask], top.values[mask], atol=TOL)
    assert not scores.logprobs_B_T[~mask].any() and not logps[~mask].any()


def _signal(method: OPDMethod, teacher: HFEngine) -> Signal:
    head = teacher.model.get_output_embeddings() if method.loss == "jsd" else None
    return Signal(method, SilentLog(NullTracker()), None, head)


@pytest.mark.parametrize("loss", ["k1", "k3", "forward_kl_topk", "jsd"])
def test_divergence_losses_equal_the_full_logits(
    loss: str, pair: tuple[HFEngine, HFEngine], rollout: dict[str, Any]
) -> None:
    student, teacher = pair
    method = OPDMethod(loss=loss, top_k=6)
    teacher_scores = teacher.score(rollout["prompts"], rollout["completions"], top_k=6)
    inputs = {k: v for k, v in rollout.items() if isinstance(v, torch.Tensor)}
    inputs["teacher_logps"] = teacher_scores.logprobs_B_T
    inputs["teacher_topk_ids"], inputs["teacher_topk_logps"] = teacher_scores.topk()
    if loss == "jsd":
        from distill.kernels.states import completion_states

        with torch.no_grad():
            inputs["teacher_hidden"] = completion_states(
                teacher.model,
                inputs["prompt_ids"],
                inputs["prompt_mask"],
                inputs["completion_ids"],
                inputs["completion_mask"],
            )
    chunked = _signal(method, teacher).divergence_loss(0, student.model, student.model, inputs)
    chunked.backward()
    got = grads(student.model)

    mask = inputs["completion_mask"].bool()
    ls_B_T_V = full_logprobs(student.model, rollout)
    if loss == "forward_kl_topk":
        at_top = ls_B_T_V.gather(-1, inputs["teacher_topk_ids"])[mask]
        ref = losses.topk_forward_kl_per_token(at_top, inputs["teacher_topk_logps"][mask]).mean()
    elif loss == "jsd":
        with torch.no_grad():
            lt_B_T_V = full_logprobs(teacher.model, rollout)
        m = torch.logsumexp(
            torch.stack([ls_B_T_V + torch.log(torch.tensor(0.5)), lt_B_T_V + torch.log(torch.tensor(0.5))]), 0
        )
        per = 0.5 * (lt_B_T_V.exp() * (lt_B_T_V - m)).sum(-1) + 0.5 * (ls_B_T_V.exp() * (ls_B_T_V - m)).sum(
            -1
        )
        ref = per[mask].mean()
    else:
        sampled = ls_B_T_V.gather(-1, inputs["completion_ids"][..., None])[..., 0]
        ref = losses.direct_kl_per_token(loss, sampled[mask], inputs["teacher_logps"][mask]).mean()
    ref.backward()
    assert abs(float(chunked.detach()) - float(ref.detach())) < TOL
    assert_same(got, grads(student.model))


def test_grpo_logps_and_the_policy_gradient_equal_the_full_logits(
    pair: tuple[HFEngine, HFEngine], rollout: dict[str, Any]
) -> None:
    """token_reward_direct: GRPO's per-token logps (at the sampling temperature) through the
    chunked head, and the on-policy loss -(A * ratio) built on them."""
    from distill.kernels.states import completion_logprobs

    student, teacher = pair
    scored_t = teacher.score(rollout["prompts"], rollout["completions"])
    scored_s = student.score(rollout["prompts"], rollout["completions"])
    adv_B_T, _ = token_advantages(
        OPDMethod(coef=1.0), scored_t.logprobs_B_T, scored_s.logprobs_B_T, scored_s.mask_B_T
    )
    ids = torch.cat([rollout["prompt_ids"], rollout["completion_ids"]], 1)
    attn = torch.cat([rollout["prompt_mask"], rollout["completion_mask"]], 1)
    mask = rollout["completion_mask"]
    width = mask.shape[1]
    logps, entropy, _ = completion_logprobs(student.model, student.model, ids, attn, width, temperature=0.7)
    (-(torch.exp(logps - logps.detach()) * adv_B_T * mask).sum() / mask.sum()).backward()
    got = grads(student.model)
    ref_B_T_V = full_logprobs(student.model, rollout, temperature=0.7)
    ref = ref_B_T_V.gather(-1, rollout["completion_ids"][..., None])[..., 0]
    on = mask.bool()
    assert torch.allclose(logps[on], ref[on], atol=TOL)
    assert torch.allclose(entropy[on], -(ref_B_T_V.exp() * ref_B_T_V).sum(-1)[on].detach(), atol=TOL)
    (-(torch.exp(ref - ref.detach()) * adv_B_T * mask).sum() / mask.sum()).backward()
    assert_same(got, grads(student.model))


def test_ce_equals_the_models_own_loss(pair: tuple[HFEngine, HFEngine], rollout: dict[str, Any]) -> None:
    """ROSE and SFT: CE on the labelled tokens, chunked, against transformers' loss on full logits."""
    from distill.kernels.states import ce_loss

    student, _ = pair
    ids = torch.cat([rollout["prompt_ids"], rollout["completion_ids"]], 1)
    attn = torch.cat([rollout["prompt_mask"], rollout["completion_mask"]], 1)
    labels = ids.masked_fill(attn == 0, -100)
    labels[:, : rollout["prompt_ids"].shape[1] + 2] = -100  # a teacher continuation after 2 prefix tokens
    batch = {"input_ids": ids, "attention_mask": attn, "labels": labels}
    for num_items in (None, 40):
        chunked = ce_loss(student.model, student.model, batch, num_items)
        chunked.backward()
        got = grads(student.model)
        ref = student.model(
            input_ids=ids, attention_mask=attn, labels=labels, num_items_in_batch=num_items
        ).loss
        ref.backward()
        assert abs(float(chunked.detach()) - float(ref.detach())) < TOL
        assert_same(got, grads(student.model))
