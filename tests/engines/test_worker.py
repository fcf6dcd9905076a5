"""WorkerEngine: an HFEngine in a spawned process answers `score` as the in-process engine does."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distill.engines.hf import HFEngine
from distill.engines.worker import WorkerEngine

pytestmark = pytest.mark.integration


def test_worker_scores_like_the_engine_and_names_its_errors(tiny_zoo: Any) -> None:
    local = HFEngine.load(str(tiny_zoo.teacher))
    prompts = [local.prompt_ids("Sort: 3 1 2"), local.prompt_ids("Add 2 and 5.")]
    completions = [local.tokenizer.encode("1 2 3")[:5], local.tokenizer.encode("7")[:5]]
    worker = WorkerEngine(str(tiny_zoo.teacher), threads=1)
    try:
        assert worker.device == "cpu"
        remote = worker.score(prompts, completions, top_k=3, states=True)
        expected = local.score(prompts, completions, top_k=3, states=True)
        assert remote.lengths() == [len(c) for c in completions]
        torch.testing.assert_close(remote.logprobs_B_T, expected.logprobs_B_T, atol=1e-5, rtol=0)
        torch.testing.assert_close(remote.topk()[1], expected.topk()[1], atol=1e-5, rtol=0)
        assert remote.states_B_T_H is not None and expected.states_B_T_H is not None
        torch.testing.assert_close(remote.states_B_T_H, expected.states_B_T_H, atol=1e-5, rtol=0)
        with pytest.raises(
            RuntimeError, match="teacher worker: ValueError: score: 2 prompts but 1 completions"
        ):
            worker.score(prompts, completions[:1])
        # Still serving after a bad request.
        assert worker.score(prompts[:1], completions[:1]).lengths() == [len(completions[0])]
    finally:
        worker.close()
    assert not worker._proc.is_alive()


def test_worker_that_cannot_load_says_which_model(tmp_path: Any) -> None:
    with pytest.raises(RuntimeError, match=f"teacher worker could not load {tmp_path}"):
        WorkerEngine(str(tmp_path))
    # Started without waiting (as rollout.async_teacher starts it), the same error comes with
    # the first request instead.
    worker = WorkerEngine(str(tmp_path), wait=False)
    try:
        with pytest.raises(RuntimeError, match=f"teacher worker could not load {tmp_path}"):
            worker.score([[1, 2]], [[3]])
    finally:
        worker.close()
    assert not worker._proc.is_alive()


def test_worker_is_the_teacher_engine_with_its_weights_in_the_worker_only(tiny_zoo: Any) -> None:
    """What the run asks of a teacher that scores in its worker (prompts, context, EOS, head rows,
    its eval's greedy answers, jsd's head) is what the in-process engine answers, and the weights
    stay in the worker: the trainer's process holds its tokenizer, never its model."""
    from distill.config import Sampling

    local = HFEngine.load(str(tiny_zoo.teacher))
    worker = WorkerEngine(str(tiny_zoo.teacher), threads=1, wait=False)
    try:
        assert not hasattr(worker, "model")
        assert worker.prompt_ids("Sort: 3 1 2") == local.prompt_ids("Sort: 3 1 2")
        assert (worker.context, worker.eos_ids) == (local.context, local.eos_ids)
        assert worker.head_rows == local.model.get_output_embeddings().weight.shape[0]
        record = worker.describe()
        assert record["worker_device"] == record["device"] == worker.device == "cpu"
        assert {k: v for k, v in record.items() if k != "worker_device"} == local.describe()
        prompts = [local.prompt_ids(p) for p in ("Sort: 3 1 2", "Add 2 and 5.", "hi")]
        done: list[int] = []
        remote = worker.generate(prompts, Sampling(6), batch_size=2, progress=done.append)
        assert [c.ids for c in remote] == [c.ids for c in local.generate(prompts, Sampling(6), batch_size=2)]
        assert done == [2, 1]  # one request a batch: the eval's progress moves as in process
        weight, bias = worker.output_head()
        torch.testing.assert_close(weight, local.model.get_output_embeddings().weight, atol=0, rtol=0)
        assert bias is None
    finally:
        worker.close()
    assert not worker.alive
    # An engine nobody holds any more takes its worker with it.
    orphan = WorkerEngine(str(tiny_zoo.teacher), threads=1)
    process = orphan._proc
    del orphan
    process.join(timeout=20)
    assert not process.is_alive()
