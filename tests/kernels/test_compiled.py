"""The compiled chunk reductions (kernels/compiled.py) against the eager loops, on the CPU (inductor)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from distill.kernels import compiled
from distill.kernels.heads import head_gather_topk, token_logprobs_entropy
from distill.kernels.jsd import chunked_jsd

V, H = 300, 16


@pytest.fixture
def restore_mode() -> Iterator[None]:
    before = compiled.mode()
    yield
    compiled.set_mode(before)


def _both(fn) -> tuple:  # type: ignore[no-untyped-def]
    compiled.set_mode("off")
    eager = fn()
    compiled.set_mode("on")
    return eager, fn()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def test_bucket_rows_are_powers_of_two_within_the_chunk() -> None:
    assert [compiled.bucket_rows(n, 220) for n in (1, 63, 64, 65, 130, 200, 220)] == [
        64,
        64,
        64,
        128,
        220,
        220,
        220,
    ]
    assert compiled.bucket_rows(3, 5) == 5  # a chunk below the smallest bucket is its own


def test_a_bad_mode_is_refused(restore_mode: None) -> None:
    with pytest.raises(ValueError, match="kernels.compile"):
        compiled.set_mode("sometimes")


def test_auto_compiles_on_cuda_only(restore_mode: None) -> None:
    compiled.set_mode("auto")
    assert not compiled.active(torch.device("cpu"))
    assert compiled.active(torch.device("cuda"))
    compiled.set_mode("on")
    assert compiled.active(torch.device("cpu"))


def test_a_threads_own_mode_wins(restore_mode: None) -> None:
    compiled.set_mode("off")
    seen: list[str] = []

    def other() -> None:
        compiled.set_mode("on")
        seen.append(compiled.mode())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    compiled.set_mode("off")  # this thread's own setting again
    assert seen == ["on"] and compiled.mode() == "off"


@pytest.mark.integration
def test_compiled_head_passes_equal_the_eager_ones(restore_mode: None) -> None:
    torch.manual_seed(0)
    weight = torch.randn(V, H) * 0.3
    hidden = torch.randn(150, H)
    ids = torch.randint(0, V, (150, 3))
    # chunk 64: two full chunks and a ragged last one (22 rows, padded to its bucket).
    eager, fused = _both(lambda: head_gather_topk(hidden, weight, None, ids, 5, chunk_size=64))
    assert torch.equal(eager[0], fused[0])  # logits at ids: the same matmul, gathered
    assert _rel(fused[1], eager[1]) <= 1e-6  # logsumexp: fp32 reduction order only
    assert torch.equal(eager[2], fused[2])  # top-k ids
    assert float((eager[3] - fused[3]).abs().max()) <= 1e-5
    targets = ids[:, 0]
    (lp_e, ent_e), (lp_f, ent_f) = _both(
        lambda: token_logprobs_entropy(hidden, weight, None, targets, temperature=0.7, chunk_size=64)
    )
    assert float((lp_e - lp_f).abs().max()) <= 1e-5 and _rel(lp_f, lp_e) <= 1e-6
    assert float((ent_e - ent_f).abs().max()) <= 1e-5


@pytest.mark.integration
def test_compiled_jsd_equals_the_eager_one_with_its_gradients(restore_mode: None) -> None:
    torch.manual_seed(1)
    ws = (torch.randn(V, H) * 0.3).requires_grad_()
    wt = torch.randn(V, H) * 0.3
    hs = torch.randn(90, H, requires_grad=True)
    ht = torch.randn(90, H)
    for beta in (0.0, 0.5, 1.0):
        results = []
        for mode in ("off", "on"):
            compiled.set_mode(mode)
            ws.grad = hs.grad = None
            loss = chunked_jsd(hs, ht, (ws, None), (wt, None), beta, chunk_size=40)
            loss.backward()
            assert hs.grad is not None and ws.grad is not None
            results.append((loss.detach(), hs.grad.clone(), ws.grad.clone()))
        (l_e, gh_e, gw_e), (l_f, gh_f, gw_f) = results
        assert float((l_e - l_f).abs()) <= 1e-6 * max(1.0, float(l_e.abs())), beta
        assert _rel(gh_f, gh_e) <= 2e-6 and _rel(gw_f, gw_e) <= 2e-6, beta


@pytest.mark.integration
def test_new_row_counts_inside_a_bucket_compile_nothing(restore_mode: None) -> None:
    import torch._dynamo.utils

    torch.manual_seed(2)
    weight = torch.randn(V, H)
    compiled.set_mode("on")
    # The first call compiles this shape's bucket; later ones with other row counts in the same
    # buckets (as a run's steps have: another token count each) reuse it.
    head_gather_topk(torch.randn(100, H), weight, None, torch.randint(0, V, (100, 1)), 4, chunk_size=128)
    graphs = compiled.compiled_graphs()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for rows in (70, 90, 127, 128):
        head_gather_topk(
            torch.randn(rows, H), weight, None, torch.randint(0, V, (rows, 1)), 4, chunk_size=128
        )
    assert compiled.compiled_graphs() == graphs
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames


def test_the_recompile_limit_is_raised_in_the_calling_thread() -> None:
    # Dynamo's settings are per thread: a limit raised once, in another thread, would leave a
    # trainer's thread at 8 graphs, after which it silently runs eager.
    import torch._dynamo

    seen: list[int] = []
    compiled._get("reduce", compiled._reduce)  # made here first: the other thread only fetches it

    def other() -> None:
        compiled._get("reduce", compiled._reduce)
        seen.append(torch._dynamo.config.recompile_limit)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [compiled.RECOMPILE_LIMIT]
