"""The teacher's scores as the loss reads them (methods/targets.py): a same-family teacher's rows in
the group layout score exactly as the same-family loss, several teachers' rows merge on one grid,
and jsd's teacher head goes where the loss runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distill.config import OPDMethod
from distill.engines.hf import HFEngine
from distill.methods.cross_family import CrossFamily
from distill.methods.scoring import vocab_rows
from distill.methods.signal import Signal
from distill.methods.targets import identity_groups, jsd_head, merged, same_family
from distill.tracking.base import NullTracker
from distill.tracking.steplog import SilentLog
from methods.test_cross_family import TOL, grads, rollout

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engines(tiny_zoo: Any) -> dict[str, HFEngine]:
    return {
        "student": HFEngine.load(str(tiny_zoo.student)),
        "teacher": HFEngine.load(str(tiny_zoo.teacher)),
        "llama": HFEngine.load(str(tiny_zoo.teacher_llama)),
    }


def _inputs(batch: dict[str, Any], targets: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {**{k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}, **targets}


@pytest.mark.parametrize("loss", ["k1", "k3", "forward_kl_topk", "token_reward_direct"])
def test_identity_groups_score_exactly_as_the_same_family_loss(
    engines: dict[str, HFEngine], loss: str
) -> None:
    """A batch with a teacher of another family holds every row as byte groups: the same-family
    teacher's rows through `identity_groups` and the group loss (with the crossing teacher's
    settings, as `Batches` builds them) give the same-family loss, gradient, advantages and figures."""
    student, teacher = engines["student"], engines["teacher"]
    method = OPDMethod(loss=loss, top_k=6)
    batch = rollout(student, seed=3)
    top_k = 6 if loss == "forward_kl_topk" else 0
    scores = teacher.score(batch["prompts"], batch["completions"], top_k=top_k)
    mask_B_T = batch["completion_mask"]
    plain_inputs = _inputs(batch, same_family(method, scores, mask_B_T))
    grouped_inputs = _inputs(batch, identity_groups(method, scores, mask_B_T, vocab_rows(student)))
    assert "xf_group" in grouped_inputs and "xf_group" not in plain_inputs
    crossing = CrossFamily(student.tokenizer, engines["llama"].tokenizer, method)
    plain = Signal(method, SilentLog(NullTracker()), None)
    grouped = Signal(method, SilentLog(NullTracker()), crossing)
    if loss == "token_reward_direct":
        own_B_T = student.score(batch["prompts"], batch["completions"]).logprobs_B_T
        plain.set_advantages(0, plain_inputs, own_B_T)
        grouped.set_advantages(0, grouped_inputs, own_B_T)
        assert plain_inputs["advantages"].abs().sum() > 0
        torch.testing.assert_close(grouped_inputs["advantages"], plain_inputs["advantages"], atol=TOL, rtol=0)
    else:
        ref = plain.divergence_loss(0, student.model, student.model, plain_inputs)
        ref.backward()
        ref_grads = grads(student.model)
        got = grouped.divergence_loss(0, student.model, student.model, grouped_inputs)
        got.backward()
        assert float(ref.detach()) != 0.0
        assert abs(float(got.detach()) - float(ref.detach())) <= TOL
        for a, b in zip(grads(student.model), ref_grads, strict=True):
            torch.testing.assert_close(a, b, atol=TOL, rtol=0)
    assert plain.log.pending
    for key, value in plain.log.pending.items():
        assert grouped.log.pending[key] == pytest.approx(value, abs=TOL), key


def test_merged_puts_each_teachers_rows_in_the_batchs_order() -> None:
    first = {
        "teacher_logps": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        "teacher_topk_ids": torch.tensor([[[5]], [[6]]]),
    }
    second = {"teacher_logps": torch.tensor([[9.0, 8.0]])}
    out = merged([([0, 2], first), ([1], second)], batch=3)
    assert out["teacher_logps"].tolist() == [[1.0, 2.0], [9.0, 8.0], [3.0, 4.0]]
    # A key one teacher lacks is the tail bucket (-1) for a top-k id, 0 otherwise, on its rows.
    assert out["teacher_topk_ids"][:, 0, 0].tolist() == [5, -1, 6]


def test_jsd_head_is_the_teachers_own_where_the_loss_runs_and_a_frozen_copy_elsewhere(
    engines: dict[str, HFEngine],
) -> None:
    """The device decision on the CPU: the same device -> the teacher's own head (no copy, so
    a live OPSD teacher's is the trained one); another device -> a frozen copy made there, said
    once; the teacher's own weights stay where they are."""
    teacher = engines["teacher"]
    own = teacher.model.get_output_embeddings()
    said: list[str] = []
    assert jsd_head(teacher, torch.device("cpu"), said.append) is own and said == []
    # `meta` stands for the student's GPU: a device the teacher's head is not on.
    copy = jsd_head(teacher, torch.device("meta"), said.append)
    assert copy is not own and copy.weight.device.type == "meta" and not copy.weight.requires_grad
    assert copy.weight.shape == own.weight.shape and own.weight.device.type == "cpu"
    assert len(said) == 1 and "copy" in said[0] and "on meta" in said[0] and "teacher on cpu" in said[0]


def test_jsd_refuses_operands_on_two_devices(engines: dict[str, HFEngine]) -> None:
    """The kernel names the mismatch instead of failing in a matmul deep in its chunk loop."""
    from distill.kernels.jsd import chunked_jsd

    head = engines["teacher"].model.get_output_embeddings()
    hidden_N_H = torch.zeros(3, head.weight.shape[1])
    with pytest.raises(ValueError, match="on cpu but a head or the teacher's hidden states on meta"):
        chunked_jsd(hidden_N_H, hidden_N_H, (head.weight, None), (head.weight.to("meta"), None), 0.5)


needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA only: a teacher beside a GPU student"
)


@needs_cuda
def test_jsd_with_the_teacher_on_the_cpu_beside_a_gpu_student(tiny_zoo: Any) -> None:
    """teacher.device=cpu beside a GPU student: the loss runs on the student's GPU with a copy of
    the teacher's head, and equals the all-CPU loss."""
    from distill.kernels.losses import jsd_loss

    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    head_S = student.model.get_output_embeddings()
    torch.manual_seed(0)
    mask_B_T = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    student_B_T_H = torch.randn(2, 4, head_S.weight.shape[1])
    teacher_B_T_H = torch.randn(2, 4, teacher.model.get_output_embeddings().weight.shape[1])
    on_cpu = jsd_loss(
        student_B_T_H, teacher_B_T_H, head_S, jsd_head(teacher, torch.device("cpu")), mask_B_T, 0.5
    )
    gpu = torch.device("cuda:0")
    head_gpu = torch.nn.Linear(head_S.weight.shape[1], head_S.weight.shape[0], bias=False).to(gpu)
    head_gpu.weight.data.copy_(head_S.weight.data)
    on_gpu = jsd_loss(
        student_B_T_H.to(gpu), teacher_B_T_H, head_gpu, jsd_head(teacher, gpu), mask_B_T.to(gpu), 0.5
    )
    assert on_gpu.device == gpu
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-5, rtol=1e-5)
