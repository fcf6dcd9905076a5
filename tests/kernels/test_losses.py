"""The OPD loss family against naive implementations on random logits, KL(p, p) = 0, gradient signs."""

from __future__ import annotations

import math

import pytest
import torch

from distill.kernels import losses

B, T, V, K = 2, 3, 11, 4


def _logits(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2


def _naive_kl(p: list[float], q: list[float]) -> float:
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q, strict=True) if pi > 0)


def _probs(logits: torch.Tensor, b: int, t: int) -> list[float]:
    row = logits[b, t].tolist()
    m = max(row)
    z = sum(math.exp(x - m) for x in row)
    return [math.exp(x - m) / z for x in row]


@pytest.mark.parametrize("kind", ["k1", "k3", "low_var_kl"])
def test_direct_kl_values_match_naive(kind: str) -> None:
    s, t = _logits(0), _logits(1)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(2))
    ls = torch.log_softmax(s, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    lt = torch.log_softmax(t, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    got = losses.direct_kl_per_token(kind, ls, lt)
    for b in range(B):
        for i in range(T):
            x = int(tokens[b, i])
            log_ps, log_pt = math.log(_probs(s, b, i)[x]), math.log(_probs(t, b, i)[x])
            want = (
                (log_ps - log_pt) * log_ps
                if kind == "k1"
                else min(math.exp(log_pt - log_ps) - (log_pt - log_ps) - 1, losses.K3_VALUE_CLAMP)
            )
            assert abs(float(got[b, i]) - want) < 1e-6


@pytest.mark.parametrize("kind", ["k3", "low_var_kl"])
def test_k3_clamps_the_value_as_verl_and_its_gradient_is_the_forward_kls(kind: str) -> None:
    # verl's low_var_kl: kl = clamp(ref - logp, -20, 20); clamp(exp(kl) - kl - 1, -10, 10).
    logp_T = torch.tensor([0.0, -0.5, -1.0, 0.0], dtype=torch.float64)
    logp_S = torch.tensor([-5.0, -0.2, -1.0, -30.0], dtype=torch.float64, requires_grad=True)
    value = losses.direct_kl_per_token(kind, logp_S, logp_T)
    r = (logp_T - logp_S.detach()).clamp(-20, 20)
    verl = (r.exp() - r - 1).clamp(-10, 10)
    assert torch.allclose(value.detach(), verl)
    assert float(value[0]) == 10.0 and float(value[3]) == 10.0  # e^5 - 6 = 142 and e^20 - 21, both cut
    value.sum().backward()
    assert logp_S.grad is not None and float(logp_S.grad[0]) == 0.0 and float(logp_S.grad[3]) == 0.0
    # Unclamped, the expected gradient under student sampling is grad KL(teacher || student): the
    # forward KL's, although the value estimates the reverse KL. Exact expectation over a vocabulary.
    z = torch.tensor([0.3, -0.2, 0.1, 0.0, -0.4], dtype=torch.float64, requires_grad=True)
    logq_T = torch.log_softmax(torch.tensor([0.1, 0.4, -0.3, 0.2, 0.0], dtype=torch.float64), -1)
    logp = torch.log_softmax(z, -1)
    per_token = losses.direct_kl_per_token(kind, logp, logq_T)
    (expected_grad,) = torch.autograd.grad((logp.exp().detach() * per_token).sum(), z)
    forward = (logq_T.exp() * (logq_T - torch.log_softmax(z, -1))).sum()
    reverse = (torch.log_softmax(z, -1).exp() * (torch.log_softmax(z, -1) - logq_T)).sum()
    (forward_grad,) = torch.autograd.grad(forward, z)
    (reverse_grad,) = torch.autograd.grad(reverse, z)
    assert torch.allclose(expected_grad, forward_grad, atol=1e-12)
    assert not torch.allclose(expected_grad, reverse_grad, atol=1e-3)


def test_topk_forward_kl_matches_naive_with_tail() -> None:
    s, t = _logits(3), _logits(4)
    lt_full = torch.log_softmax(t, -1)
    top = lt_full.topk(K, dim=-1)
    at_teacher_top = torch.log_softmax(s, -1).gather(-1, top.indices)
    got = losses.topk_forward_kl_per_token(at_teacher_top, top.values, tail=True)
    got_no_tail = losses.topk_forward_kl_per_token(at_teacher_top, top.values, tail=False)
    for b in range(B):
        for i in range(T):
            p, q = _probs(t, b, i), _probs(s, b, i)
            ids = top.indices[b, i].tolist()
            p_k, q_k = [p[j] for j in ids], [q[j] for j in ids]
            head = sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p_k, q_k, strict=True))
            tail = _naive_kl([1 - sum(p_k)], [1 - sum(q_k)])
            assert abs(float(got_no_tail[b, i]) - head) < 1e-6
            assert abs(float(got[b, i]) - (head + tail)) < 1e-6


def test_topk_with_k_equal_vocab_is_the_full_forward_kl() -> None:
    s, t = _logits(5), _logits(6)
    top = torch.log_softmax(t, -1).topk(V, dim=-1)
    got = losses.topk_forward_kl_per_token(torch.log_softmax(s, -1).gather(-1, top.indices), top.values)
    for b in range(B):
        for i in range(T):
            assert abs(float(got[b, i]) - _naive_kl(_probs(t, b, i), _probs(s, b, i))) < 1e-6


def _naive_jsd(s: torch.Tensor, t: torch.Tensor, beta: float, b: int, i: int) -> float:
    p_s, p_t = _probs(s, b, i), _probs(t, b, i)
    if beta == 0:
        return _naive_kl(p_t, p_s)
    if beta == 1:
        return _naive_kl(p_s, p_t)
    m = [(1 - beta) * a + beta * c for a, c in zip(p_s, p_t, strict=True)]
    return beta * _naive_kl(p_t, m) + (1 - beta) * _naive_kl(p_s, m)


class _Head(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = None


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_chunked_jsd_matches_naive(beta: float) -> None:
    g = torch.Generator().manual_seed(7)
    H = 5
    hs, ht = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    ws, wt = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = losses.jsd_loss(hs, ht, _Head(ws), _Head(wt), mask, beta)
    s, t = (hs @ ws.T).double(), (ht @ wt.T).double()
    cells = [(b, i) for b in range(B) for i in range(T) if mask[b, i]]
    want = sum(_naive_jsd(s, t, beta, b, i) for b, i in cells) / len(cells)
    # The chunked JSD computes in float32: equal to the float64 reference to 1e-6 relative.
    assert abs(float(got.detach()) - want) < 1e-6 * max(1.0, want)


def test_every_divergence_of_a_distribution_with_itself_is_zero() -> None:
    s = _logits(8)
    ls_full = torch.log_softmax(s, -1)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(9))
    ls = ls_full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    for kind in losses.DIRECT_KL:
        assert losses.direct_kl_per_token(kind, ls, ls).abs().max() < 1e-12
    top = ls_full.topk(K, dim=-1)
    at_top = ls_full.gather(-1, top.indices)
    assert losses.topk_forward_kl_per_token(at_top, top.values).abs().max() < 1e-12
    h, w = torch.randn(B, T, 5), torch.randn(V, 5)
    for beta in (0.0, 0.5, 1.0):
        assert abs(float(losses.jsd_loss(h, h, _Head(w), _Head(w), torch.ones(B, T), beta))) < 1e-6


def _step_raises_logprob_of(kind: str, x: int) -> tuple[float, float]:
    """One gradient step on student logits, teacher = student with +3 on token x; logp_S(x) before/after."""
    logits = torch.zeros(1, 1, V, dtype=torch.float64, requires_grad=True)
    teacher = torch.zeros(1, 1, V, dtype=torch.float64)
    teacher[..., x] = 3.0
    ls_full, lt_full = torch.log_softmax(logits, -1), torch.log_softmax(teacher, -1)
    mask = torch.ones(1, 1)
    if kind in losses.DIRECT_KL:
        tok = torch.tensor([[x]])
        per_token = losses.direct_kl_per_token(
            kind,
            ls_full.gather(-1, tok.unsqueeze(-1)).squeeze(-1),
            lt_full.gather(-1, tok.unsqueeze(-1)).squeeze(-1),
        )
    else:
        top = lt_full.topk(K, dim=-1)
        per_token = losses.topk_forward_kl_per_token(ls_full.gather(-1, top.indices), top.values)
    ((per_token * mask).sum() / mask.sum()).backward()
    assert logits.grad is not None
    after = torch.log_softmax(logits.detach() - 0.1 * logits.grad, -1)
    return float(ls_full[0, 0, x]), float(after[0, 0, x])


@pytest.mark.parametrize("kind", ["k1", "k3", "low_var_kl", "forward_kl_topk"])
def test_gradient_step_moves_the_student_toward_the_teachers_token(kind: str) -> None:
    before, after = _step_raises_logprob_of(kind, x=4)
    assert after > before + 1e-4


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_jsd_gradient_moves_the_student_toward_the_teacher(beta: float) -> None:
    H = 4
    hs = torch.randn(1, 1, H, generator=torch.Generator().manual_seed(1))
    head = _Head(torch.randn(V, H, generator=torch.Generator().manual_seed(2)))
    teacher_w = head.weight.detach().clone()
    teacher_w[4] += 3.0 * hs[0, 0] / hs[0, 0].norm() ** 2  # teacher: +3 on token 4's logit
    loss = losses.jsd_loss(hs, hs, head, _Head(teacher_w), torch.ones(1, 1), beta)
    loss.backward()
    assert head.weight.grad is not None
    before = torch.log_softmax(hs[0, 0] @ head.weight.detach().T, -1)[4]
    after = torch.log_softmax(hs[0, 0] @ (head.weight.detach() - 0.5 * head.weight.grad).T, -1)[4]
    assert after > before + 1e-4


def test_unknown_direct_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match="method.loss"):
        losses.direct_kl_per_token("k9", torch.zeros(1, 1), torch.zeros(1, 1))


def test_topk_overlap_counts_shared_tokens() -> None:
    student_ids = torch.tensor([[0, 1], [3, 2]])  # the student's own top-2 at two positions
    teacher_ids = torch.tensor([[0, 2], [2, 3]])  # one of two shared, then both
    assert losses.topk_overlap(student_ids, teacher_ids) == pytest.approx(0.75)
