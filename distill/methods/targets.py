"""The teacher's scores as the loss reads them: per-row tensors on the trainer's [B, T] grid.

One teacher of the student's tokenizer gives `teacher_logps` (and `teacher_topk_*` or
`teacher_hidden` where the loss needs them). A teacher of another family gives its byte groups
(`xf_*`, cross_family.py). A batch whose rows go to several teachers, one of them cross-family,
holds every row as groups: a same-family row is one group per token (`identity_groups`), which
the group path scores exactly as the same-family one (tests/methods/test_targets.py).

Everything here lands on the trainer's device (the batch's mask's), wherever the teacher scored:
its logprobs, top-k and hidden states per batch, and jsd's teacher head once (`jsd_head`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from distill.config import OnPolicyKL
from distill.engines.hf import HFEngine
from distill.engines.worker import WorkerEngine
from distill.kernels.sharded import inference_sharded, whole_copy
from distill.methods.scoring import check_lengths

if TYPE_CHECKING:
    from distill.engines.base import Engine, TokenScores


def same_family(method: OnPolicyKL, teacher: TokenScores, mask_B_T: torch.Tensor) -> dict[str, torch.Tensor]:
    """A teacher of the student's tokenizer: its logprobs of the sampled ids, and its top-k
    (forward_kl_topk) or hidden states (jsd), on the batch's grid (lengths checked, never cut)."""
    teacher = teacher.widened(mask_B_T.shape[1])
    check_lengths(mask_B_T, teacher)
    device = mask_B_T.device
    out = {"teacher_logps": teacher.logprobs_B_T.to(device)}
    if method.loss == "forward_kl_topk":
        ids_B_T_K, logps_B_T_K = teacher.topk()
        out.update(teacher_topk_ids=ids_B_T_K.to(device), teacher_topk_logps=logps_B_T_K.to(device))
    elif method.loss == "jsd" and teacher.states_B_T_H is not None:
        out["teacher_hidden"] = teacher.states_B_T_H.to(device)
    return out


def identity_groups(
    method: OnPolicyKL, teacher: TokenScores, mask_B_T: torch.Tensor, student_rows: int
) -> dict[str, torch.Tensor]:
    """A same-family teacher's rows in the cross-family layout: every token a group of its own,
    supervised by the top-k where the loss reads one (ids the student has no row for: -1, the
    tail bucket)."""
    plain = same_family(method, teacher, mask_B_T)
    B, T = mask_B_T.shape
    on_B_T = mask_B_T.bool()
    out = {
        "xf_group": torch.arange(T, device=mask_B_T.device).expand(B, T).clone(),
        "xf_weight": on_B_T.float(),
        "xf_last": on_B_T.float(),
        "xf_single": on_B_T.clone(),
        "teacher_logps": plain["teacher_logps"] * on_B_T,
    }
    if "teacher_topk_ids" in plain:
        ids_B_T_K = plain["teacher_topk_ids"]
        out["teacher_topk_ids"] = torch.where(ids_B_T_K < student_rows, ids_B_T_K, -1)
        out["teacher_topk_logps"] = plain["teacher_topk_logps"]
    return out


def merged(parts: list[tuple[list[int], dict[str, torch.Tensor]]], batch: int) -> dict[str, torch.Tensor]:
    """Each teacher's targets of its own rows (`rows`, in the batch's order) on one [B, ...] grid;
    a key one teacher lacks (a top-k a sampled-token group does not need) is zero for its rows."""
    out: dict[str, torch.Tensor] = {}
    for rows, targets in parts:
        index = torch.tensor(rows, dtype=torch.long)
        for key, value in targets.items():
            if key not in out:
                fill = -1 if key == "teacher_topk_ids" else 0
                out[key] = value.new_full((batch, *value.shape[1:]), fill)
            out[key][index.to(value.device)] = value
    return out


def jsd_head(engine: Engine, device: torch.device, say: Callable[[str], Any] = print) -> torch.nn.Module:
    """jsd's teacher output head on `device`, where the loss applies it (the student's): the
    teacher's own head when its weights are there (the live one of an OPSD teacher), else a
    frozen copy made once (a teacher on another device, in its worker process, or split over the
    ranks, whose head is then the one piece of it this process holds whole), said in one line."""
    if isinstance(engine, HFEngine) and inference_sharded(engine.model):
        # Split over the ranks (teacher.shard): its head gathered once (every rank builds its trainer).
        own = engine.model.get_output_embeddings()
        weight, bias = whole_copy(own.weight), None if own.bias is None else whole_copy(own.bias)
        where = "sharded over the processes"
    elif isinstance(engine, HFEngine):
        own = engine.model.get_output_embeddings()
        weight, bias = own.weight, getattr(own, "bias", None)
        assert isinstance(weight, torch.Tensor), "an nn.Linear output head"
        if weight.device == torch.device(device):
            return own
        where = f"on {weight.device}"
    elif isinstance(engine, WorkerEngine):
        weight, bias = engine.output_head()
        where = f"in its worker process on {engine.device}"
    else:  # engines/compat.py refuses a served teacher for jsd at config time
        raise ValueError("method.loss=jsd applies the teacher's output head here: it needs an hf teacher")
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    head.weight = torch.nn.Parameter(weight.detach().to(device), requires_grad=False)
    if isinstance(bias, torch.Tensor):
        head.bias = torch.nn.Parameter(bias.detach().to(device), requires_grad=False)
    size = weight.numel() * weight.element_size() / 2**30
    say(
        f"note: jsd applies the teacher's output head beside the student: a copy of it "
        f"({weight.shape[0]:,} x {weight.shape[1]:,}, {size:.2f} GiB) on {device}, the teacher {where}"
    )
    return head
