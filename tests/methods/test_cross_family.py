"""Cross-family OPD (methods/cross_family.py): the byte-group path on the tiny zoo's real models
and tokenizers. One tokenizer forced through it equals same-family OPD (loss, gradient,
advantages); the group signals, their placement and the vocabulary-mapped top-k behave as
documented; the real TRL trainer runs a cross-family pair end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from distill.config import OPDMethod, RunConfig, Sampling
from distill.domains import build_domain
from distill.engines.base import TokenScores, right_pad
from distill.engines.hf import HFEngine
from distill.methods.context import RunContext
from distill.methods.cross_family import CrossFamily, group_view, segment_sums
from distill.methods.signal import Signal
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import SilentLog, StepLog

pytestmark = pytest.mark.integration
TOL = 1e-6
PROMPTS = ("What is 3 times 4? Answer 12345.", "Sort: 3 1 2", "hi")


@pytest.fixture(scope="module")
def engines(tiny_zoo: Any) -> dict[str, HFEngine]:
    torch.manual_seed(0)
    return {
        "student": HFEngine.load(str(tiny_zoo.student)),
        "teacher": HFEngine.load(str(tiny_zoo.teacher)),
        "llama": HFEngine.load(str(tiny_zoo.teacher_llama)),
    }


def rollout(student: HFEngine, seed: int = 1) -> dict[str, Any]:
    """Sampled completions of different lengths in the on-policy trainer's layout."""
    torch.manual_seed(seed)
    prompts = [student.prompt_ids(p) for p in PROMPTS]
    completions = [c.ids for c in student.generate(prompts, Sampling(14, 1.0))]
    completions[2] = completions[2][:5]
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


def signal(method: OPDMethod, cross: CrossFamily | None) -> Signal:
    """The loss side as the trainer holds it, its figures kept in `signal.log.pending`."""
    return Signal(method, SilentLog(NullTracker()), cross)


def same_family_inputs(batch: dict[str, Any], teacher: HFEngine, top_k: int) -> dict[str, Any]:
    scores = teacher.score(batch["prompts"], batch["completions"], top_k=top_k)
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    inputs["teacher_logps"] = scores.logprobs_B_T
    inputs["teacher_topk_ids"], inputs["teacher_topk_logps"] = scores.topk()
    return inputs


def cross_inputs(
    batch: dict[str, Any], cross: CrossFamily, teacher: HFEngine, top_k: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """The generation side of the cross-family path: cross, align, teacher-score, place."""
    samples = cross.align(batch["completions"])
    prompts = [teacher.prompt_ids(p) for p in PROMPTS[: len(samples)]]
    scores = teacher.score(prompts, [s.teacher_ids for s in samples], top_k=top_k)
    targets, figures = cross.targets(samples, scores, batch["completion_mask"])
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return {**inputs, **targets}, figures


def grads(model: Any) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("loss", ["k1", "k3", "forward_kl_topk"])
def test_one_tokenizer_through_the_cross_path_equals_same_family(
    engines: dict[str, HFEngine], loss: str
) -> None:
    student, teacher = engines["student"], engines["teacher"]
    method = OPDMethod(loss=loss, top_k=6, cross_family="always")
    batch = rollout(student)
    cross = CrossFamily(student.tokenizer, teacher.tokenizer, method)
    assert cross.bridge.same
    if cross.projection is not None:  # the vocabulary map of a tokenizer onto itself is the identity
        vocab = len(student.tokenizer)
        assert torch.equal(cross.projection.map_V[:vocab], torch.arange(vocab))
    plain = signal(method, None)
    ref = plain.divergence_loss(0, student.model, student.model, same_family_inputs(batch, teacher, 6))
    ref.backward()
    ref_grads = grads(student.model)
    inputs, figures = cross_inputs(batch, cross, teacher, 6)
    assert figures["kl/one_to_one_share"] == 1.0 and figures["bridge/seam_failure_rate"] == 0.0
    crossed = signal(method, cross)
    got = crossed.divergence_loss(0, student.model, student.model, inputs)
    got.backward()
    assert abs(float(got.detach()) - float(ref.detach())) <= TOL and float(ref.detach()) != 0.0
    for a, b in zip(grads(student.model), ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)
    for key in plain.log.pending:
        assert crossed.log.pending[key] == pytest.approx(plain.log.pending[key], abs=TOL), key


@pytest.mark.parametrize("mode", ["spread", "last"])
def test_one_tokenizer_advantages_equal_same_family(engines: dict[str, HFEngine], mode: str) -> None:
    """token_reward_direct: the advantages GRPO's loss reads, from the loss forward's logprobs."""
    student, teacher = engines["student"], engines["teacher"]
    method = OPDMethod(cross_family="always", group_advantage=mode)
    batch = rollout(student, seed=2)
    own = student.score(batch["prompts"], batch["completions"]).logprobs_B_T
    plain, plain_inputs = signal(method, None), same_family_inputs(batch, teacher, 1)
    plain.set_advantages(0, plain_inputs, own)
    cross = CrossFamily(student.tokenizer, teacher.tokenizer, method)
    crossed, inputs = signal(method, cross), cross_inputs(batch, cross, teacher, 1)[0]
    crossed.set_advantages(0, inputs, own)
    assert plain_inputs["advantages"].abs().sum() > 0
    torch.testing.assert_close(inputs["advantages"], plain_inputs["advantages"], atol=TOL, rtol=0)
    for key in plain.log.pending:
        assert crossed.log.pending[key] == pytest.approx(plain.log.pending[key], abs=TOL), key


def test_group_sums_and_placement_on_a_hand_built_batch() -> None:
    """Groups of 3, 1 and 2 student tokens in row 0, one token each in row 1 (padding after)."""
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    inputs = {
        "completion_mask": mask,
        "xf_group": torch.tensor([[0, 0, 0, 1, 2, 2], [0, 1, 0, 0, 0, 0]]),
        "xf_weight": torch.tensor([[1.0, 1, 1, 0, 1, 1], [1, 1, 0, 0, 0, 0]]),
        "xf_last": torch.tensor([[0.0, 0, 1, 1, 0, 1], [1, 1, 0, 0, 0, 0]]),
        "xf_single": torch.zeros(2, 6, dtype=torch.bool),
        "teacher_logps": torch.tensor([[-1.0, -1, -1, 0, -2, -2], [-0.5, -0.25, 0, 0, 0, 0]]),
    }
    logp = torch.tensor([[-0.1, -0.2, -0.3, -9.0, -1.0, -0.5], [-1.0, -1.0, 0, 0, 0, 0]], requires_grad=True)
    view = group_view(inputs, mask)
    sums = view.student(logp[mask.bool()], "spread")
    assert torch.allclose(sums, torch.tensor([-0.6, -0.6, -0.6, -9.0, -1.5, -1.5, -1.0, -1.0]))
    assert view.size_N.tolist() == [3, 3, 3, 1, 2, 2, 1, 1]
    # The group objective's gradient is the spread placement: each token of a group gets A_g.
    adv_g = torch.tensor([2.0, 2, 2, 0, -1, -1, 3, 4])
    (adv_g * sums * view.last_N).sum().backward()
    assert logp.grad is not None and logp.grad[mask.bool()].tolist() == adv_g.tolist()
    logp.grad = None
    (adv_g * view.student(logp[mask.bool()], "last") * view.last_N).sum().backward()
    assert logp.grad[mask.bool()].tolist() == [0.0, 0.0, 2.0, 0.0, 0.0, -1.0, 3.0, 4.0]
    method = OPDMethod()
    student_B_T = logp.detach()
    from distill.methods.cross_family import group_advantages

    spread, figures = group_advantages(method, "spread", inputs, student_B_T)
    kl_N = figures.reverse_kl_N
    gaps = [-1 + 0.6] * 3 + [0.0] + [-2 + 1.5] * 2
    assert torch.allclose(spread[0], torch.tensor(gaps)) and torch.allclose(
        spread[1, :2], torch.tensor([0.5, 0.75])
    )
    assert torch.allclose(kl_N[:3], torch.tensor([0.4 / 3] * 3))  # -gap, shared by the group's tokens
    last, _ = group_advantages(method, "last", inputs, student_B_T)
    assert torch.allclose(last[0], torch.tensor([0, 0, -0.4, 0, 0, -0.5]))
    assert segment_sums(torch.ones(3), torch.tensor([0, 0, 2]), 3).tolist() == [2.0, 2.0, 1.0]


def test_cross_family_pair_groups_and_vocabulary_map(engines: dict[str, HFEngine]) -> None:
    """qwen-style student (single digits) against the llama-style teacher (up to 3 digits)."""
    student, llama = engines["student"], engines["llama"]
    method = OPDMethod(loss="forward_kl_topk", top_k=8)
    cross = CrossFamily(student.tokenizer, llama.tokenizer, method)
    assert not cross.bridge.same and cross.projection is not None
    s_tok, t_tok = student.tokenizer, llama.tokenizer
    # Specials by role: the teacher's eos maps to the student's eos; a digit to the same digit.
    assert int(cross.projection.map_V[t_tok.eos_token_id]) == s_tok.eos_token_id
    assert int(cross.projection.map_V[t_tok.convert_tokens_to_ids("7")]) == s_tok.convert_tokens_to_ids("7")
    text = "smallest 123, left 45 6.\n\\boxed{123}"
    ids = list(s_tok(text, add_special_tokens=False)["input_ids"]) + [s_tok.eos_token_id]
    batch = {"completions": [ids], "completion_mask": torch.ones(1, len(ids), dtype=torch.long)}
    inputs, figures = cross_inputs({**batch, "completion_ids": torch.tensor([ids])}, cross, llama, 8)
    sample = cross.align([ids])[0]
    assert sample.ok and t_tok.decode(sample.teacher_ids, skip_special_tokens=True) == text
    sizes = {(g.student_len, g.teacher_len) for g in sample.groups}
    # Digits: one token each on the student's side, merged on the teacher's ("12" or "123").
    assert (1, 1) in sizes and any(s > 1 and t == 1 for s, t in sizes)
    assert 0.0 < figures["kl/one_to_one_share"] < 1.0 and figures["kl/max_group_student"] >= 2.0
    # The teacher's top-k lands only on one-token groups, in student ids.
    single = inputs["xf_single"][0]
    ids_T_K = inputs["teacher_topk_ids"][0]
    assert (ids_T_K[~single] == -1).all() and (ids_T_K[single] >= 0).any()
    assert int(ids_T_K[single].max()) < len(s_tok)
    # The group's teacher logprob is the sum of its teacher tokens' logprobs.
    scores = llama.score([llama.prompt_ids(PROMPTS[0])], [sample.teacher_ids])
    g = max(sample.groups, key=lambda g: g.teacher_len)
    want = float(scores.logprobs_B_T[0, g.t0 : g.t1].sum())
    assert g.teacher_len > 1 or any(x.student_len > 1 for x in sample.groups)
    assert inputs["teacher_logps"][0, g.s0 : g.s1].tolist() == pytest.approx([want] * g.student_len, abs=1e-6)


def test_seam_failure_is_masked_out(engines: dict[str, HFEngine]) -> None:
    student, llama = engines["student"], engines["llama"]
    cross = CrossFamily(student.tokenizer, llama.tokenizer, OPDMethod())
    s_tok = student.tokenizer
    im_start = s_tok.convert_tokens_to_ids("<|im_start|>")  # the llama template has no such token
    ok = list(s_tok("left 5 9", add_special_tokens=False)["input_ids"])
    bad = [*ok[:2], im_start, *ok[2:]]
    rows = [ok, bad]
    comp_ids, comp_mask = right_pad(rows, int(s_tok.pad_token_id))
    batch = {"completions": rows, "completion_ids": comp_ids, "completion_mask": comp_mask}
    samples = cross.align(rows)
    assert samples[0].ok and not samples[1].ok and "dropped" in samples[1].failure
    scores = llama.score([llama.prompt_ids("x")] * 2, [s.teacher_ids for s in samples])
    targets, figures = cross.targets(samples, scores, comp_mask)
    assert figures["bridge/seam_failure_rate"] == 0.5
    assert targets["xf_weight"][1].sum() == 0 and targets["xf_weight"][0, : len(ok)].all()
    assert not targets["teacher_logps"][1].any()
    assert figures["bridge/supervised_share"] == pytest.approx(len(ok) / (2 * len(ok) + 1))
    del batch


def _run(
    tmp_path: Path, tiny_zoo: Any, pair: tuple[Path, Path], method: dict[str, Any], name: str
) -> list[dict[str, Any]]:
    from distill.methods.opd import train

    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": {"name": "opd", **method},
            "rollout": {
                "prompts_per_step": 4,
                "num_generations": 2,
                "max_new_tokens": 16,
                "temperature": 0.7,
            },
            "optim": {"lr": 1e-3, "max_steps": 2},
            "checkpoint": {"every_steps": 0},
            "seed": 3,
        }
    )
    run_dir = tmp_path / name
    run_dir.mkdir()
    ctx = RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=build_domain(config.domain),
        student=HFEngine.load(str(pair[0])),
        teacher=HFEngine.load(str(pair[1])),
        log=StepLog(RunDir(run_dir), NullTracker()),
    )
    train(ctx)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _made_up_teacher(t_tok: Any, teacher_ids: list[int], K: int = 8) -> TokenScores:
    """The teacher's scores, made up so that the top-k reaches every token: at each position its
    own token 0.5, up to three tokens extending its bytes 0.1 each, other tokens 0.01 each."""
    from distill.tokenizer_bridge.projection import byte_table

    data = byte_table(t_tok)
    ids_T_K, probs_T_K = [], []
    for a in teacher_ids:
        longer = [i for i, b in enumerate(data) if i != a and data[a] and b.startswith(data[a])][:3]
        rest = [i for i in range(len(data)) if data[i] and i != a and i not in longer][: K - 1 - len(longer)]
        ids_T_K.append([a, *longer, *rest])
        probs_T_K.append([0.5] + [0.1] * len(longer) + [0.01] * len(rest))
    probs = torch.tensor(probs_T_K)[None]
    return TokenScores(
        probs[..., 0].log(), torch.ones(1, len(teacher_ids)), torch.tensor(ids_T_K)[None], probs.log()
    )


def test_digits_of_one_teacher_token_are_supervised_one_by_one(engines: dict[str, HFEngine]) -> None:
    """The teacher's "123" for the student's "1" "2" "3": each digit becomes a group of its own with
    the teacher's byte-level distribution over the next digit (tokenizer_bridge/projection.py), and
    the teacher logprobs of the split tokens add up to the group's: nothing is lost or counted twice."""
    s_tok, t_tok = engines["student"].tokenizer, engines["llama"].tokenizer
    cross = CrossFamily(s_tok, t_tok, OPDMethod(loss="forward_kl_topk", top_k=8))
    ids = list(s_tok("smallest 123, left 45 6.", add_special_tokens=False)["input_ids"]) + [
        s_tok.eos_token_id
    ]
    sample = cross.align([ids])[0]
    scores = _made_up_teacher(t_tok, sample.teacher_ids)
    inputs, figures = cross.targets([sample], scores, torch.ones(1, len(ids), dtype=torch.long))
    whole, _ = CrossFamily(s_tok, t_tok, OPDMethod(loss="k3")).targets(
        [sample], scores, torch.ones(1, len(ids))
    )
    single, ids_T_K, logps_T_K = (
        inputs["xf_single"][0],
        inputs["teacher_topk_ids"][0],
        inputs["teacher_topk_logps"][0],
    )
    split = [g for g in sample.groups if g.student_len > 1 and g.teacher_len == 1]
    assert split, "the zoo's llama-style tokenizer writes some number of the text as one token"
    for g in split:
        assert bool(single[g.s0 : g.s1].all()), g
        got = float(inputs["teacher_logps"][0, g.s0 : g.s1].sum())
        assert got == pytest.approx(float(whole["teacher_logps"][0, g.s0]), abs=1e-5)  # the group's
        for j in range(g.s0, g.s1):
            mapped = ids_T_K[j] >= 0
            assert float(logps_T_K[j][mapped].exp().sum()) <= 1 + 1e-5
            assert float(inputs["teacher_logps"][0, j]) == pytest.approx(
                float(logps_T_K[j][ids_T_K[j] == ids[j]])
            )
    digits = [j for j, i in enumerate(ids) if s_tok.decode([i]).isdigit()]
    assert all(bool(single[j]) for j in digits)
    assert figures["kl/topk_share"] == pytest.approx(float(single.float().mean()))


@pytest.mark.parametrize("loss", ["token_reward_direct", "forward_kl_topk"])
def test_forced_cross_path_trains_exactly_like_same_family(tmp_path: Path, tiny_zoo: Any, loss: str) -> None:
    """Through the real TRL trainer (GRPO's shuffle and split of the batch included), 2 steps."""
    method = {"loss": loss, "top_k": 8}
    pair = (tiny_zoo.student, tiny_zoo.teacher)
    ref = _run(tmp_path, tiny_zoo, pair, method, "same")
    got = _run(tmp_path, tiny_zoo, pair, {**method, "cross_family": "always"}, "forced")
    assert len(ref) == len(got) == 2
    for a, b in zip(ref, got, strict=True):
        for key in ("train/loss", "kl/reverse_kl_mean", "kl/advantage_mean", "train/grad_norm"):
            assert b[key] == pytest.approx(a[key], abs=TOL), key
        assert b["kl/aligned_share"] == 1.0 and b["bridge/seam_failure_rate"] == 0.0
        assert b.get("kl/topk_share", 1.0) == 1.0  # one tokenizer: the top-k reaches every token


@pytest.mark.parametrize("loss", ["token_reward_direct", "k3", "forward_kl_topk"])
def test_cross_family_pair_trains_and_logs_alignment(tmp_path: Path, tiny_zoo: Any, loss: str) -> None:
    # The tiny zoo's qwen-family teacher as the student: the 20-step tiny student writes raw
    # bytes that are not UTF-8 (every sample a seam failure); this one writes text.
    pair = (tiny_zoo.teacher, tiny_zoo.teacher_llama)
    rows = _run(tmp_path, tiny_zoo, pair, {"loss": loss, "top_k": 8}, loss)
    last = rows[-1]
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in rows)
    assert 0.5 < last["kl/aligned_share"] <= 1.0 and last["kl/groups_per_student_token"] <= 1.0
    assert last["bridge/seam_failure_rate"] < 0.5 and last["bridge/supervised_share"] > 0.5
    assert last["kl/reverse_kl_mean"] != 0.0


def test_jsd_is_refused_cross_family(tmp_path: Path, tiny_zoo: Any) -> None:
    with pytest.raises(ValueError, match="jsd compares full distributions over one shared vocabulary"):
        _run(tmp_path, tiny_zoo, (tiny_zoo.student, tiny_zoo.teacher_llama), {"loss": "jsd"}, "jsd")


def test_a_sampled_token_loss_is_warned_and_the_mapped_top_k_is_not() -> None:
    from distill.methods.cross_family import warning

    assert warning(OPDMethod(loss="forward_kl_topk"), "zoo:student", "zoo:teacher-llama") is None
    for loss in ("token_reward_direct", "k1", "k3"):
        note = warning(OPDMethod(loss=loss), "zoo:student", "zoo:teacher-llama")
        assert note and f"method.loss={loss}" in note and "forward_kl_topk" in note
        assert "zoo:student <- zoo:teacher-llama" in note
