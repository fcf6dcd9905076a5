"""The teacher's top-k read as a distribution over the student's next token
(tokenizer_bridge/projection.py), on the zoo's real tokenizers: a qwen-style student that writes
digits one by one against a llama-style teacher with multi-digit tokens."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from distill.tokenizer_bridge.granularity import vocab_map
from distill.tokenizer_bridge.projection import NO_MASS, Projection, merge_mapped, projection_map


@pytest.fixture(scope="module")
def pair(tiny_zoo: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(str(tiny_zoo.tok_qwen))
    teacher = AutoTokenizer.from_pretrained(str(tiny_zoo.tok_llama))
    return {"student": student, "teacher": teacher, "projection": Projection(student, teacher)}


def _id(tok: Any, text: str) -> int:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return int(ids[0])


def _two_digit_tokens(teacher: Any) -> tuple[str, list[str]]:
    """A digit d and two of the teacher's two-digit tokens starting with it (d itself a token)."""
    vocab = {tok for tok in teacher.get_vocab() if tok.isdigit()}
    for d in "123456789":
        longer = sorted(t for t in vocab if len(t) == 2 and t[0] == d)
        if d in vocab and len(longer) >= 2:
            return d, longer[:2]
    raise AssertionError("the zoo's llama-style vocabulary has no two-digit tokens")


def test_the_map_sends_a_teacher_token_to_the_student_token_it_starts_with(pair: dict[str, Any]) -> None:
    s, t, proj = pair["student"], pair["teacher"], pair["projection"]
    d, (ab, _) = _two_digit_tokens(t)
    assert int(proj.map_V[_id(t, ab)]) == _id(s, d)  # "15" starts with the student's "1"
    assert int(proj.map_V[_id(t, d)]) == _id(s, d)  # same bytes: the same token
    assert int(proj.map_V[t.eos_token_id]) == s.eos_token_id  # specials by role
    exact = vocab_map(s, t)
    assert all(int(proj.map_V[i]) == j for i, j in enumerate(exact) if j >= 0)
    # One tokenizer: every token has its own bytes on the other side, so the map is the identity.
    assert projection_map(s, s) == vocab_map(s, s)


def test_merged_entries_keep_the_mass_and_count_no_student_id_twice() -> None:
    ids = torch.tensor([[3, 5, 3, -1, 3]])
    logps = torch.log(torch.tensor([[0.2, 0.3, 0.1, 0.15, 0.05]]))
    out_ids, out_logps = merge_mapped(ids, logps, chunk=1)
    assert out_ids.tolist() == [[3, 5, -1, -1, -1]]
    assert out_logps[0, :2].exp().tolist() == pytest.approx([0.35, 0.3], rel=1e-6)
    assert out_logps[0, 2].item() == NO_MASS and out_logps[0, 4].item() == NO_MASS
    assert out_logps[0, 3].exp().item() == pytest.approx(0.15)  # an unmapped entry: left as it is
    # Nothing to merge: the same ids and logprobs, bit for bit (one tokenizer's path).
    once_ids, once_logps = merge_mapped(torch.tensor([[4, 2, -1]]), logps[:, :3])
    assert once_ids.tolist() == [[4, 2, -1]] and torch.equal(once_logps, logps[:, :3])


def _target(ids_K: torch.Tensor, logps_K: torch.Tensor) -> dict[int, float]:
    return {int(i): math.exp(float(lp)) for i, lp in zip(ids_K, logps_K, strict=True) if int(i) >= 0}


def _top_k(t: Any, tokens: list[str], probs: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([_id(t, x) for x in tokens]), torch.log(torch.tensor(probs))


def _digits(t: Any) -> tuple[str, str, str, str]:
    """d, two teacher tokens "ab" and "ac" that start with it, and another single digit."""
    d, (ab, ac) = _two_digit_tokens(t)
    return d, ab, ac, next(x for x in "0123456789" if x != d and x in t.get_vocab())


def test_inside_a_teacher_token_the_next_digit_is_the_conditional(pair: dict[str, Any]) -> None:
    """The teacher wrote "15", the student "1" then ?: P(? | "1") from the teacher's top-k."""
    s, t, proj = pair["student"], pair["teacher"], pair["projection"]
    d, ab, ac, other = _digits(t)
    d_u = _top_k(t, [ab, ac, d, other], [0.3, 0.2, 0.1, 0.4])
    ids_K, logps_K = proj.after_prefix(d.encode(), _id(t, ab), math.log(0.3), d_u, None)
    # M("d") = 0.6; "ab" goes on with b, "ac" with c; the token that is exactly "d" ended where
    # the student's did not: its 0.1 stays in the tail; "other" does not start with d.
    want = {_id(s, ab[1]): 0.3 / 0.6, _id(s, ac[1]): 0.2 / 0.6}
    assert _target(ids_K, logps_K) == pytest.approx(want, rel=1e-5) and len(ids_K) == 4


def test_after_a_token_that_closed_a_number_the_next_distribution_joins_in(pair: dict[str, Any]) -> None:
    """The teacher's "d" said the number *is* d; the student's "d" only that it starts with d."""
    s, t, proj = pair["student"], pair["teacher"], pair["projection"]
    d, ab, ac, other = _digits(t)
    d_u = _top_k(t, [d, ab, ac, other], [0.4, 0.1, 0.1, 0.4])
    d_next = _top_k(t, [",", " "], [0.9, 0.1])
    ids_K, logps_K = proj.after_prefix(d.encode(), _id(t, d), math.log(0.4), d_u, d_next)
    want = {
        _id(s, ab[1]): 0.1 / 0.6,
        _id(s, ac[1]): 0.1 / 0.6,
        _id(s, ","): 0.4 * 0.9 / 0.6,
        _id(s, " "): 0.4 * 0.1 / 0.6,
    }
    assert _target(ids_K, logps_K) == pytest.approx(want, rel=1e-5)
    assert sum(want.values()) == pytest.approx(1.0)  # all of M("d") is accounted for here
