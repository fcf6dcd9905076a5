"""The teacher's top-k as a distribution over the student's next token, at every aligned position.

Two vocabularies have no shared support, but they share bytes. The student's token s at a
position means "the next bytes start with s's bytes" wherever the student's vocabulary has no
longer token starting with them (its digits, when it writes numbers digit by digit). The teacher's
top-k says the same thing in its own tokens, so it can be read at byte level:

- **At a boundary both sides mean the same** (the teacher's token starts where the student's does,
  and the previous boundary closed the same event on both sides): each teacher token t goes to the
  student token its bytes start with, `projection_map` (same bytes where the student has them,
  else the student's longest token that is a prefix of t's bytes). Entries landing on one student
  id are merged (`merge_mapped`).
- **Inside a teacher token, or after one that closed what the student's left open** (the student
  writes `1` `5` where the teacher wrote `15`; the student's `,` after `5` where the teacher's `5`
  said the number *is* 5): the teacher token u covering the bytes p just before the student's
  token was drawn from a distribution D_u. Among D_u's top-k, the tokens that extend p continue
  with their remaining bytes (to the student token those start with), u among them when the
  student's token starts inside it; when it starts right after u, u continues with the teacher's
  next distribution D_next:

      P(next | p) = [ sum_{t in D_u, t extends p} P(t) * [sigma(t - p)]
                      + P(u) * sum_{t' in D_next} P(t') * [sigma(t')] ] / M(p)

  with M(p) the mass of D_u's tokens that start with p (u always counted). Tokens whose bytes are
  exactly p but are not u ended where the student's did not, and their next distribution was never
  scored: their share stays in the tail bucket. This is the byte-level conditional with one token
  of lookahead, the same quantity boundary.py's group correction scores for one sampled token.

With one tokenizer the first case is the only one and the map is the identity, so nothing changes
from same-family OPD. Computed on the CPU once per step from the teacher's [B, T, k] top-k; the
second case is a Python loop over the (few) positions inside multi-byte teacher tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from distill.tokenizer_bridge.granularity import vocab_bytes, vocab_map

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# A merged-away or empty entry: mapped to no student id, with no teacher mass.
NO_MASS = -1e4


def projection_map(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> list[int]:
    """teacher id -> the student id its token *starts with*: the student token with the same bytes
    where there is one (`granularity.vocab_map`: specials by role, one-to-one), otherwise the
    student's longest token whose bytes are a prefix of the teacher token's. -1: neither."""
    return _projection_map(student, teacher, byte_table(teacher), PrefixLookup(byte_table(student)))


def _projection_map(
    student: PreTrainedTokenizerBase,
    teacher: PreTrainedTokenizerBase,
    teacher_bytes: list[bytes],
    lookup: PrefixLookup,
) -> list[int]:
    out = vocab_map(student, teacher)
    for i, value in enumerate(teacher_bytes):
        if out[i] < 0 and value and value not in lookup.by_bytes:
            out[i] = lookup.longest(value[:-1])
    return out


def byte_table(tokenizer: PreTrainedTokenizerBase) -> list[bytes]:
    """id -> its bytes; b"" for specials and unused ids (they never extend a byte prefix)."""
    data = vocab_bytes(tokenizer)
    out = [b""] * (max(data, default=-1) + 1)
    for i, value in data.items():
        if isinstance(value, bytes):
            out[i] = value
    return out


class PrefixLookup:
    """The student's tokens by bytes: which token a run of bytes starts with."""

    def __init__(self, student_bytes: list[bytes]) -> None:
        self.by_bytes: dict[bytes, int] = {}
        for i, value in enumerate(student_bytes):
            if value:
                self.by_bytes.setdefault(value, i)
        self.longest_len = max(map(len, self.by_bytes), default=0)

    def longest(self, data: bytes) -> int:
        """The student's longest token whose bytes are a prefix of `data` (-1: none)."""
        for n in range(min(len(data), self.longest_len), 0, -1):
            j = self.by_bytes.get(data[:n])
            if j is not None:
                return j
        return -1


def merge_mapped(
    ids_N_K: torch.Tensor, logps_N_K: torch.Tensor, chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k entries mapped to the same student id become one (the first), carrying their summed
    probability; the others get id -1 and no mass, so no student probability is counted twice and
    the tail bucket still holds exactly the teacher mass outside the mapped entries."""
    ids_N_K, logps_N_K = ids_N_K.clone(), logps_N_K.float().clone()
    K = ids_N_K.shape[-1]
    earlier_K_K = torch.ones((K, K), dtype=torch.bool).tril(-1)  # [k, j]: j < k
    for lo in range(0, ids_N_K.shape[0], chunk):  # [n, K, K] per chunk, never [N, K, K]
        ids, logps = ids_N_K[lo : lo + chunk], logps_N_K[lo : lo + chunk]
        same_n_K_K = (ids[:, :, None] == ids[:, None, :]) & (ids >= 0)[:, :, None]
        merged = torch.where(same_n_K_K, logps[:, None, :], float("-inf")).logsumexp(-1)
        later = (same_n_K_K & earlier_K_K).any(-1)
        ids_N_K[lo : lo + chunk] = torch.where(later, -1, ids)
        logps_N_K[lo : lo + chunk] = torch.where(later, NO_MASS, torch.where(ids >= 0, merged, logps))
    return ids_N_K, logps_N_K


class Projection:
    """A pair's byte-level reading of the teacher's top-k (module docstring), built once per run."""

    def __init__(self, student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> None:
        self.teacher_bytes = byte_table(teacher)
        self.student_bytes = byte_table(student)
        self.lookup = PrefixLookup(self.student_bytes)
        mapped = _projection_map(student, teacher, self.teacher_bytes, self.lookup)
        self.map_V = torch.tensor(mapped, dtype=torch.long)

    def at_boundary(
        self, ids_N_K: torch.Tensor, logps_N_K: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher top-k rows at shared boundaries -> student ids (merged)."""
        inside = (ids_N_K >= 0) & (ids_N_K < self.map_V.numel())
        mapped = torch.where(inside, self.map_V[ids_N_K.clamp(0, self.map_V.numel() - 1)], -1)
        return merge_mapped(mapped, logps_N_K)

    def after_prefix(
        self,
        prefix: bytes,
        u: int,
        logp_u: float,
        d_u: tuple[torch.Tensor, torch.Tensor],
        d_next: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's distribution over the student's next token after the bytes `prefix` of its
        token u (drawn with logprob `logp_u` from top-k `d_u`); `d_next`: the teacher's top-k after
        u, given when the student's token starts right after u. Returns k entries (merged)."""
        ids_K, logps_K = (x.tolist() for x in d_u)
        entries: list[tuple[int, float]] = []
        mass = [logp_u]  # M(p): u always counts, whether or not it made the top-k
        for t, lp in zip(ids_K, logps_K, strict=True):
            data = self.teacher_bytes[t] if 0 <= t < len(self.teacher_bytes) else b""
            if t == u or not data.startswith(prefix) or not data:
                continue
            mass.append(lp)
            if len(data) > len(prefix):  # it extends p: it goes on with its remaining bytes
                entries.append((self.lookup.longest(data[len(prefix) :]), lp))
        if d_next is not None:
            for t, lp in zip(*(x.tolist() for x in d_next), strict=True):
                j = int(self.map_V[t]) if 0 <= t < self.map_V.numel() else -1
                entries.append((j, logp_u + lp))
        elif len(self.teacher_bytes[u]) > len(prefix):  # the student's token is inside u
            entries.append((self.lookup.longest(self.teacher_bytes[u][len(prefix) :]), logp_u))
        log_m = torch.tensor(mass).logsumexp(0).item()
        K = len(ids_K)
        out_ids, out_logps = torch.full((K,), -1, dtype=torch.long), torch.full((K,), NO_MASS)
        kept = [(j, lp - log_m) for j, lp in entries if j >= 0]
        if kept:
            ids_1_E, logps_1_E = merge_mapped(
                torch.tensor([[j for j, _ in kept]]), torch.tensor([[lp for _, lp in kept]])
            )
            top = logps_1_E[0].topk(min(K, len(kept)))
            out_ids[: len(top.indices)], out_logps[: len(top.indices)] = ids_1_E[0, top.indices], top.values
        return out_ids, out_logps
