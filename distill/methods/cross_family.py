"""Cross-family OPD: the student samples in its tokens, the teacher scores the same text in its own.

At generation time each completion crosses to the teacher's tokens through the tokenizer bridge
(specials by role, never as text; tokenizer_bridge/granularity.py), the teacher scores it after
its *own* chat-template rendering of the prompt, and the two tokenizations are cut into byte
groups (tokenizer_bridge/align.py): minimal runs of student and teacher tokens covering the same
bytes. A sample whose conversion is not lossless is a seam failure and is masked out.

The batch carries the groups as per-student-token [B, T] tensors, so GRPO's shuffle and split
along dim 0 keep working: `xf_group` (the token's group index in its row), `xf_weight` (1 where
the group has tokens on both sides and the sample crossed cleanly), `xf_last` (the group's last
student token), `xf_single` (a token the mapped top-k supervises, a group of its own: one token a
side, or split off a group below) and `teacher_logps` (the group's
teacher logprob, the sum over its teacher tokens, at each of its student tokens). The student's
group logprob, the sum over its tokens, is computed in the loss forward from the same pass that
trains (differentiable): a scatter-add of the per-token logprobs into their groups and a gather
back (`segment_sums`), exact in any precision, never a Python loop over tokens.

Signals per group, for A_g = coef * (logp_T(g) - logp_S(g)):
- token_reward_direct, k1, k3: the same-family formulas on group logprobs. `method.group_advantage`
  spread (default) puts A_g on every student token of the group: since logp_S(g) is a sum, the
  gradient of sum_g A_g * logp_S(g) is exactly A_g on each of them. `last` puts it on the group's
  last token only (the gradient through the other tokens is dropped); for k1/k3 the same holds:
  the group value is unchanged, its gradient flows through the last token only.
- forward_kl_topk: KL(teacher || student) over the teacher's top-k read as a distribution over
  the student's next token (tokenizer_bridge/projection.py, built once per pair): at a one-token
  group whose boundaries mean the same on both sides, each teacher token goes to the student token
  its bytes start with (the same bytes where the student has them, as GOLD maps them; specials by
  role); inside a teacher token (the student's `1` `5` for its `15`) and right after one that
  closed what the student's token left open (the `,` after a number), the byte-level conditional
  with one token of lookahead. Such a group is split: each supervised student token becomes a
  group of its own, and the rest keeps the group's teacher logprob less theirs. Teacher mass the
  student cannot start with goes to the tail bucket (`method.topk_tail`). Tokens the top-k cannot
  supervise (a group of several teacher tokens; a student token with longer alternatives ending
  where the teacher's does not; a sampled token outside the top-k) keep the group-level
  sampled-token form k3, whose gradient has the forward KL's expectation: the same objective.
The teacher's group logprobs carry boundary.py's correction where a group's end means different
events on the two sides (a teacher token that closes a number the student's token leaves open).
Every reduction is over the completion tokens, as in same-family OPD: masked tokens add nothing.
With one tokenizer on both sides (`method.cross_family=always`) every group is one token a side,
the map is the identity, and every number equals same-family OPD's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from distill import registry
from distill.config import OnPolicyKL, OPDMethod
from distill.kernels import losses
from distill.kernels.heads import head_gather, head_gather_topk, scatter_positions
from distill.methods.scoring import Figures, advantages, clipped
from distill.tokenizer_bridge.align import alignment_metrics, group_index, group_sums_torch
from distill.tokenizer_bridge.boundary import prefix_correction, prefix_index
from distill.tokenizer_bridge.bridge import TokenizerBridge, same_tokenizer
from distill.tokenizer_bridge.granularity import align_sample
from distill.tokenizer_bridge.projection import Projection

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.config import RunConfig
    from distill.engines.base import Engine, TokenScores
    from distill.tokenizer_bridge.granularity import AlignedSample

# The batch keys of the cross-family path (besides teacher_logps / teacher_topk_*).
KEYS = ("xf_group", "xf_weight", "xf_last", "xf_single")


def crosses(config: RunConfig, student: Engine, teacher: Engine) -> bool:
    """Whether this run scores the student's tokens through the byte-aligned path: a method
    whose separate teacher scores them (registry.py), and tokenizers that differ, or
    `method.cross_family=always`."""
    if not registry.method_entry(config.method.name).cross_family_scoring:
        return False
    forced = isinstance(config.method, OPDMethod) and config.method.cross_family == "always"
    return forced or not same_tokenizer(student.tokenizer, teacher.tokenizer)


def refusal(method: OnPolicyKL, student: str, teacher: str) -> str | None:
    """Why a cross-family pair cannot run this method's loss (None: it can)."""
    if method.loss == "jsd":
        return (
            f"opd: method.loss=jsd compares full distributions over one shared vocabulary; {student} and "
            f"{teacher} tokenize differently: use forward_kl_topk (vocabulary-mapped top-k), "
            "token_reward_direct, k1 or k3 (docs/cross_family.md)"
        )
    return None


def warning(method: OnPolicyKL, student: str, teacher: str) -> str | None:
    """What a cross-family run should know before it starts (None: nothing). The sampled-token
    forms train each byte group on one sampled token; only forward_kl_topk reads the teacher's whole
    top-k at byte level, and only it lifted the student on the embedded default (docs/cross_family.md)."""
    if method.loss == "forward_kl_topk":
        return None
    return (
        f"cross-family OPD ({student} <- {teacher}) with method.loss={method.loss} trains each byte group on "
        "one sampled token; on the embedded default only method.loss=forward_kl_topk, which reads the "
        "teacher's top-k at byte level, lifts the student (docs/cross_family.md)"
    )


class CrossFamily:
    """The pair's bridge, vocabulary map and group settings, built once per run."""

    def __init__(
        self, student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, method: OPDMethod
    ) -> None:
        self.bridge = TokenizerBridge(student, teacher)
        self.mode = method.group_advantage
        # What a boundary means on each side (tokenizer_bridge/boundary.py), built once per pair.
        self.teacher_prefix = prefix_index(teacher)
        self.student_signature = prefix_index(student).signature
        self.projection: Projection | None = None
        if method.loss == "forward_kl_topk":
            self.projection = Projection(student, teacher)

    def align(self, completion_rows: list[list[int]]) -> list[AlignedSample]:
        return [align_sample(self.bridge, row) for row in completion_rows]

    def targets(
        self, samples: list[AlignedSample], teacher: TokenScores, mask_B_T: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The teacher's scores of the crossed samples as per-student-token tensors on the
        batch's grid (see the module docstring), and the step's alignment figures."""
        teacher.check([s.teacher_ids for s in samples], "teacher")
        lengths = [int(n) for n in mask_B_T.sum(dim=1).tolist()]
        B, T = mask_B_T.shape
        out = {
            "xf_group": torch.zeros((B, T), dtype=torch.long),
            "xf_weight": torch.zeros((B, T)),
            "xf_last": torch.zeros((B, T)),
            "xf_single": torch.zeros((B, T), dtype=torch.bool),
            "teacher_logps": torch.zeros((B, T)),
        }
        logps_B_Tt = teacher.logprobs_B_T.detach().float().cpu()
        # Scored without top-k (a sampled-token loss may be): the plain group sums, no projection.
        scored = teacher.topk_ids_B_T_K is not None
        topk = tuple(t.detach().cpu() for t in teacher.topk()) if scored else None
        differ_rows = [self.boundaries_differ(sample) for sample in samples]
        corr_B_Tt = self._corrections(samples, differ_rows, topk, logps_B_Tt)
        singles: list[tuple[int, int, int]] = []  # (row, student position, teacher position)
        for b, (sample, n, differ) in enumerate(zip(samples, lengths, differ_rows, strict=True)):
            singles += _place_row(out, b, sample, n, logps_B_Tt[b] + corr_B_Tt[b], _clean_groups(differ))
        if self.projection is not None:
            assert topk is not None, "forward_kl_topk scores the teacher with its top-k"
            out.update(self._topk(topk, singles, B, T))
            for b, (sample, differ) in enumerate(zip(samples, differ_rows, strict=True)):
                self._project_row(out, b, sample, differ, (topk[0][b], topk[1][b]), logps_B_Tt[b])
                _renumber(out, b, lengths[b])
        figures = _metrics(samples, out["xf_weight"], lengths)
        if self.projection is not None:  # how much of the supervised text the top-k reaches
            on = out["xf_weight"] > 0
            figures["kl/topk_share"] = float((out["xf_single"] & on).sum()) / max(float(on.sum()), 1.0)
        device = mask_B_T.device
        return {k: v.to(device) for k, v in out.items()}, figures

    def _corrections(
        self,
        samples: list[AlignedSample],
        differ_rows: list[list[bool]],
        topk: tuple[torch.Tensor, ...] | None,
        logps_B_Tt: torch.Tensor,
    ) -> torch.Tensor:
        """Per teacher position, what to add to its logprob so that each group scores the
        byte-level conditional (boundary.py): c(last) at a group's last teacher token where the
        two sides' last tokens differ in what could extend them, minus the previous such group's."""
        out_B_Tt = torch.zeros_like(logps_B_Tt)
        if topk is None:  # scored without top-k: the plain group sums
            return out_B_Tt
        ids_B_Tt = torch.zeros(logps_B_Tt.shape, dtype=torch.long)
        for b, sample in enumerate(samples):
            ids_B_Tt[b, : len(sample.teacher_ids)] = torch.tensor(sample.teacher_ids, dtype=torch.long)
        c_B_Tt = prefix_correction(self.teacher_prefix, ids_B_Tt, logps_B_Tt, *topk)
        for b, (sample, differ_G) in enumerate(zip(samples, differ_rows, strict=True)):
            previous = 0.0
            for g, differ in zip(sample.groups, differ_G, strict=True):
                if g.t1 <= g.t0 or g.s1 <= g.s0:
                    continue
                c = float(c_B_Tt[b, g.t1 - 1]) if differ else 0.0
                out_B_Tt[b, g.t1 - 1] += c
                out_B_Tt[b, g.t0] -= previous  # the group starts where the previous one's lookahead ended
                previous = c
        return out_B_Tt

    def boundaries_differ(self, sample: AlignedSample) -> list[bool]:
        """Per group: whether its end means different events on the two sides (boundary.py)."""
        t_sig, s_sig = self.teacher_prefix.signature, self.student_signature
        return [
            g.t1 > g.t0
            and g.s1 > g.s0
            and t_sig[sample.teacher_ids[g.t1 - 1]] != s_sig[sample.student_ids[g.s1 - 1]]
            for g in sample.groups
        ]

    def _topk(
        self, topk: tuple[torch.Tensor, ...], singles: list[tuple[int, int, int]], B: int, T: int
    ) -> dict[str, torch.Tensor]:
        """The teacher's top-k (ids, logprobs [B, Tt, K] on the CPU) at the one-token groups,
        projected onto the student's next token (tokenizer_bridge/projection.py; -1: no student
        token those bytes start with); zeros elsewhere."""
        assert self.projection is not None
        ids_B_Tt_K, logps_B_Tt_K = topk
        K = ids_B_Tt_K.shape[-1]
        ids_B_T_K = torch.full((B, T, K), -1, dtype=torch.long)
        logps_B_T_K = torch.zeros((B, T, K))
        if singles:
            b, s, t = torch.tensor(singles, dtype=torch.long).unbind(1)
            ids_B_T_K[b, s], logps_B_T_K[b, s] = self.projection.at_boundary(
                ids_B_Tt_K[b, t], logps_B_Tt_K[b, t]
            )
        return {"teacher_topk_ids": ids_B_T_K, "teacher_topk_logps": logps_B_T_K}

    def _project_row(
        self,
        out: dict[str, torch.Tensor],
        b: int,
        sample: AlignedSample,
        differ: list[bool],
        topk_Tt: tuple[torch.Tensor, torch.Tensor],
        logps_Tt: torch.Tensor,
    ) -> None:
        """The groups of one teacher token that are not a clean one-token pair (the student's
        `1` `5` for the teacher's `15`; the student's `,` after a teacher token that closed a
        number): each of their student tokens, from the first, gets the teacher's byte-level
        distribution over its next token (projection.py) and becomes a group of its own; the
        rest of the group keeps the group's teacher logprob less the teacher's logprobs of the
        split tokens. The walk stops at a token with a longer student alternative that ends where
        the teacher's token does not (its meaning is not "the next bytes start with these") or
        one the teacher's top-k does not reach."""
        assert self.projection is not None
        proj, sig = self.projection, self.student_signature
        ids_Tt_K, logps_Tt_K = topk_Tt
        single_T = out["xf_single"][b].tolist()  # a Python list: one lookup per group, 16k-token rows
        for i, g in enumerate(sample.groups):
            if g.teacher_len != 1 or g.special is not None or single_T[g.s0]:
                continue
            u, taken = sample.teacher_ids[g.t0], 0.0
            for j in range(g.s0, g.s1):
                sampled = sample.student_ids[j]
                # A token that may end where the teacher's does not, with longer alternatives of
                # its own the teacher's tokens could not tell apart: not "the next bytes start
                # with these" alone. Where both ends mean the same, the map holds as at any boundary.
                if sig[sampled] != 0 and (j < g.s1 - 1 or differ[i]):
                    break
                if j > g.s0:  # inside u, after the group's first j - s0 student tokens
                    prefix = b"".join(proj.student_bytes[x] for x in sample.student_ids[g.s0 : j])
                    target = proj.after_prefix(
                        prefix, u, float(logps_Tt[g.t0]), (ids_Tt_K[g.t0], logps_Tt_K[g.t0]), None
                    )
                elif i > 0 and differ[i - 1]:  # right after a teacher token that closed more
                    t_prev = sample.groups[i - 1].t1 - 1
                    prev = sample.teacher_ids[t_prev]
                    target = proj.after_prefix(
                        proj.teacher_bytes[prev],
                        prev,
                        float(logps_Tt[t_prev]),
                        (ids_Tt_K[t_prev], logps_Tt_K[t_prev]),
                        (ids_Tt_K[g.t0], logps_Tt_K[g.t0]),
                    )
                else:  # a boundary that means the same on both sides
                    ids_K, logps_K = proj.at_boundary(ids_Tt_K[g.t0][None], logps_Tt_K[g.t0][None])
                    target = ids_K[0], logps_K[0]
                hit = (target[0] == sampled).nonzero()
                if not len(hit):
                    break
                q = float(target[1][int(hit[0])])
                out["teacher_topk_ids"][b, j], out["teacher_topk_logps"][b, j] = target
                out["xf_single"][b, j], out["xf_last"][b, j] = True, 1.0
                out["teacher_logps"][b, j] = q
                taken += q
            out["teacher_logps"][b, g.s0 : g.s1] -= torch.where(out["xf_single"][b, g.s0 : g.s1], 0.0, taken)


def _renumber(out: dict[str, torch.Tensor], b: int, n: int) -> None:
    """A row's group index after splits: a new group at every change of group and at every token
    that is a group of its own (`xf_single`), so the indices stay within the row (< T)."""
    group_T, single_T = out["xf_group"][b, :n], out["xf_single"][b, :n]
    starts_T = torch.ones(n, dtype=torch.long)
    if n > 1:
        starts_T[1:] = ((group_T[1:] != group_T[:-1]) | single_T[1:] | single_T[:-1]).long()
    out["xf_group"][b, :n] = starts_T.cumsum(0) - 1


def _clean_groups(differ: list[bool]) -> list[bool]:
    """Groups whose start and end boundaries mean the same on both sides: there the teacher's
    distribution is over the same next bytes as the student's, and the mapped top-k may compare
    them; elsewhere the teacher's context has closed a token the student's has not."""
    return [not d and not (i > 0 and differ[i - 1]) for i, d in enumerate(differ)]


def _place_row(
    out: dict[str, torch.Tensor],
    b: int,
    sample: AlignedSample,
    n: int,
    teacher_Tt: torch.Tensor,
    clean: list[bool],
) -> list[tuple[int, int, int]]:
    """One row's groups onto the student grid; returns its one-token-a-side groups."""
    groups = sample.groups
    if sample.kept > n:
        raise ValueError(f"cross-family: sample {b} aligns {sample.kept} student tokens but has {n}")
    # Tokens outside the groups (a seam failure, a trailing partial character): a group each, weight 0.
    own = list(range(len(groups), len(groups) + n - sample.kept))
    out["xf_group"][b, :n] = torch.tensor(group_index(groups, "student") + own, dtype=torch.long)
    if not groups:
        return []
    idx = torch.tensor(group_index(groups, "student"), dtype=torch.long)
    matched_G = torch.tensor([g.matched for g in groups])
    one_G = torch.tensor(
        [g.student_len == 1 == g.teacher_len and ok for g, ok in zip(groups, clean, strict=True)]
    )
    single_G = one_G & matched_G
    sums_G = group_sums_torch(teacher_Tt[: len(sample.teacher_ids)], groups, "teacher")
    weight = matched_G[idx].float()
    k = sample.kept
    out["xf_weight"][b, :k] = weight
    out["xf_single"][b, :k] = single_G[idx]
    out["teacher_logps"][b, :k] = sums_G[idx] * weight
    out["xf_last"][b, [g.s1 - 1 for g in groups if g.s1 > g.s0]] = 1.0
    return [(b, g.s0, g.t0) for g, one in zip(groups, single_G.tolist(), strict=True) if one]


def _metrics(samples: list[AlignedSample], weight_B_T: torch.Tensor, lengths: list[int]) -> dict[str, float]:
    groups = [g for s in samples if s.ok for g in s.groups]
    return {
        **alignment_metrics(groups),
        "bridge/seam_failure_rate": sum(not s.ok for s in samples) / max(len(samples), 1),
        "bridge/supervised_share": float(weight_B_T.sum()) / max(sum(lengths), 1),
    }


# --- the loss side: in the loss forward, at the completion positions (N, row-major) -------------


def segment_sums(values_N: torch.Tensor, seg_N: torch.Tensor, segments: int) -> torch.Tensor:
    """Each position's segment total, at every position of the segment: a scatter-add and a
    gather, differentiable (each position's gradient is its segment's), exact for one-token
    segments; a cumsum difference would lose fp32 precision over 16k-token rows."""
    return values_N.new_zeros(segments).index_add(0, seg_N, values_N).index_select(0, seg_N)


@dataclass
class GroupView:
    """The micro-batch's groups at its completion positions (the batch keys, selected by mask)."""

    seg_N: torch.Tensor  # the token's group, unique across the micro-batch
    segments: int
    weight_N: torch.Tensor
    last_N: torch.Tensor
    single_N: torch.Tensor
    teacher_N: torch.Tensor  # the group's teacher logprob
    size_N: torch.Tensor  # the group's student tokens

    def student(self, logp_S_N: torch.Tensor, mode: str) -> torch.Tensor:
        """The group's student logprob (sum over its tokens) at each of its tokens; `last`: the
        same value, with its gradient through the group's last token only."""
        if mode == "last":
            logp_S_N = logp_S_N.detach() + self.last_N * (logp_S_N - logp_S_N.detach())
        return segment_sums(logp_S_N, self.seg_N, self.segments)


def group_view(inputs: dict[str, Any], mask_B_T: torch.Tensor) -> GroupView:
    mask = mask_B_T.bool()
    B, T = mask.shape
    offsets_B_1 = torch.arange(B, device=mask.device)[:, None] * T
    seg_N = (inputs["xf_group"] + offsets_B_1)[mask]
    ones_N = torch.ones(seg_N.shape, device=mask.device)
    return GroupView(
        seg_N,
        B * T,
        inputs["xf_weight"][mask],
        inputs["xf_last"][mask],
        inputs["xf_single"][mask],
        inputs["teacher_logps"][mask],
        segment_sums(ones_N, seg_N, B * T),
    )


def group_advantages(
    method: OnPolicyKL, mode: str, inputs: dict[str, Any], student_B_T: torch.Tensor
) -> tuple[torch.Tensor, Figures]:
    """token_reward_direct: the advantages [B, T] from the loss forward's logprobs, and the
    figures of the supervised tokens (a group's gap shared by its tokens)."""
    mask = inputs["completion_mask"].bool()
    view = group_view(inputs, mask)
    gap_N = (view.teacher_N - view.student(student_B_T[mask].detach(), "spread")) * view.weight_N
    adv_N = advantages(method, gap_N) * view.weight_N
    if mode == "last":
        adv_N = adv_N * view.last_N
    on = view.weight_N > 0
    clip_N = clipped(method, gap_N[on])
    figures = Figures(-(gap_N / view.size_N)[on], adv_N[on], clip_N, kept_N=on)
    return scatter_positions(adv_N, mask), figures


def group_divergence(
    method: OnPolicyKL,
    mode: str,
    head: tuple[torch.Tensor, torch.Tensor | None],
    hidden_N_H: torch.Tensor,
    inputs: dict[str, Any],
) -> tuple[torch.Tensor, Figures]:
    """k1 / k3 / forward_kl_topk on the groups: the loss and the figures of the supervised tokens,
    through the chunked head (no [N, V] tensor)."""
    mask = inputs["completion_mask"].bool()
    view = group_view(inputs, mask)
    sampled_N = inputs["completion_ids"][mask]
    weight, bias = head
    topk: dict[str, Any] = {}
    if method.loss == "forward_kl_topk":
        teacher_ids_N_K = inputs["teacher_topk_ids"][mask]
        mapped_N_K = teacher_ids_N_K >= 0
        ids_N_K1 = torch.cat([sampled_N[:, None], teacher_ids_N_K.clamp_min(0)], dim=1)
        gathered, lse_N, student_ids_N_K, _ = head_gather_topk(
            hidden_N_H, weight, bias, ids_N_K1, teacher_ids_N_K.shape[-1]
        )
        logp_S_N = gathered[:, 0] - lse_N
        topk_N = losses.topk_forward_kl_per_token(
            gathered[:, 1:] - lse_N[:, None],
            inputs["teacher_topk_logps"][mask],
            method.topk_tail,
            mapped_N_K.to(gathered.dtype),
        )
        group_N = losses.direct_kl_per_token("k3", view.student(logp_S_N, mode), view.teacher_N)
        per_N = torch.where(view.single_N, topk_N, group_N * view.last_N) * view.weight_N
        one = view.single_N & (view.weight_N > 0)
        with torch.no_grad():
            mapped_one = mapped_N_K[one].to(gathered.dtype)
            topk = {
                "topk_overlap": losses.topk_overlap(student_ids_N_K[one], teacher_ids_N_K[one]),
                "student_topk_mass_N": ((gathered[one, 1:] - lse_N[one, None]).exp() * mapped_one).sum(-1),
                "teacher_topk_mass_N": (inputs["teacher_topk_logps"][mask][one].exp() * mapped_one).sum(-1),
            }
    else:
        gathered, lse_N = head_gather(hidden_N_H, weight, bias, sampled_N[:, None])
        logp_S_N = gathered[:, 0] - lse_N
        per_N = losses.direct_kl_per_token(method.loss, view.student(logp_S_N, mode), view.teacher_N)
        per_N = per_N * view.last_N * view.weight_N
    loss = per_N.sum() / max(per_N.numel(), 1)
    gap_N = (view.teacher_N - view.student(logp_S_N.detach(), "spread")) * view.weight_N
    adv_N = advantages(method, gap_N) * view.weight_N * (view.last_N if mode == "last" else 1.0)
    on = view.weight_N > 0
    figures = Figures(-(gap_N / view.size_N)[on], adv_N[on], clipped(method, gap_N[on]), kept_N=on, **topk)
    return loss, figures
