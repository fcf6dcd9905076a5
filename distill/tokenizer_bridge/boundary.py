"""What a token boundary means on each side of a cross-family pair, and the teacher's correction.

A byte group ends where both tokenizations have a token boundary, but the two boundaries need not
mean the same event. A tokenizer whose vocabulary has `15` writes the number 15 as one token, so
its token `5` after `smallest ` says "the number *is* 5"; a student whose vocabulary has digits only
writes `5` for "the number starts with 5". The teacher's group logprob then scores a narrower event
than the student's, and the next group (`,`) a broader one; over the whole sample the two still add
up to the exact log-ratio, but per group the credit is misplaced, and a per-token advantage pushes
down the student's correct leading digits (measured: docs/cross_family.md).

The teacher's side is corrected with its own distribution at the group's last token t: the
probability that its text *continues with* t's bytes is the mass M(t) of every token whose bytes
extend t's (from the teacher's top-k at that position, where the alternatives that matter are;
t's own probability always counts). With c(t) = log M(t) - logp(t) >= 0, a group's teacher
logprob becomes sum(logp) + c(last token) - c(the previous group's last token): the byte-level
conditional with one token of lookahead, and the sum over a sample is unchanged (c = 0 at eos).

The correction applies only at boundaries whose tokens differ in what could extend them: the set of
byte continuations of the teacher's last token in its vocabulary against the student's last token's
in its own. With one tokenizer on both sides these are always equal, so nothing changes and the
path stays exactly same-family OPD.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from distill.tokenizer_bridge.granularity import vocab_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class PrefixIndex:
    """A vocabulary sorted by bytes: the tokens extending token a have ranks in [lo[a], hi[a])."""

    rank_V: torch.Tensor  # -1 for specials and empty entries
    lo_V: torch.Tensor
    hi_V: torch.Tensor
    signature: list[int]  # per id: a hash of the set of byte continuations its vocabulary has


def _successor(b: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `b` (None: none)."""
    while b and b[-1] == 0xFF:
        b = b[:-1]
    return b[:-1] + bytes([b[-1] + 1]) if b else None


def prefix_index(tokenizer: PreTrainedTokenizerBase) -> PrefixIndex:
    data = vocab_bytes(tokenizer)
    size = max(data, default=-1) + 1
    items = sorted((b, i) for i, b in data.items() if isinstance(b, bytes) and b)
    keys = [b for b, _ in items]
    rank, lo, hi = [-1] * size, [0] * size, [0] * size
    signature = [0] * size
    for r, (b, i) in enumerate(items):
        rank[i] = r
        nxt = _successor(b)
        end = bisect.bisect_left(keys, nxt) if nxt is not None else len(keys)
        # Several ids with the same bytes sort together: the range starts at the first of them.
        start = bisect.bisect_left(keys, b)
        lo[i], hi[i] = start, end
        continuations = frozenset(k[len(b) :] for k in keys[start:end] if len(k) > len(b))
        signature[i] = hash(continuations) if continuations else 0
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return PrefixIndex(as_long(rank), as_long(lo), as_long(hi), signature)


def prefix_correction(
    index: PrefixIndex,
    ids_B_T: torch.Tensor,
    logps_B_T: torch.Tensor,
    topk_ids_B_T_K: torch.Tensor,
    topk_logps_B_T_K: torch.Tensor,
) -> torch.Tensor:
    """c = log M(t) - logp(t) >= 0 at every position: M(t) is the probability of the token t
    plus that of every other top-k token whose bytes extend t's (0 where t has no extension)."""
    rank_V, lo_V, hi_V = index.rank_V, index.lo_V, index.hi_V
    ids_B_T = ids_B_T.clamp(0, rank_V.numel() - 1)
    others_B_T_K = topk_ids_B_T_K.clamp(0, rank_V.numel() - 1)
    r_B_T_K = rank_V[others_B_T_K]
    extends = (
        (r_B_T_K >= lo_V[ids_B_T][..., None])
        & (r_B_T_K < hi_V[ids_B_T][..., None])
        & (others_B_T_K != ids_B_T[..., None])
        & (r_B_T_K >= 0)
        & (rank_V[ids_B_T] >= 0)[..., None]
    )
    logps_B_T = logps_B_T.float()
    extra_B_T = (topk_logps_B_T_K.float().exp() * extends).sum(-1)
    return torch.log1p(extra_B_T / logps_B_T.exp().clamp_min(1e-30))
