"""A teacher sharded for inference (`shard_for_inference`, `teacher.shard=true`) over 2 CPU processes
(gloo) under FSDP2 and ZeRO-3, as `accelerate launch` sets them up: each rank holds about half of
its parameter bytes, and `HFEngine.score` gives the whole teacher's scores (logprobs, top-k, hidden
states) even when the ranks need different numbers of scoring passes (rank 0 three, rank 1 one:
without the agreed count the ranks' collectives do not pair up, and gloo aborts the launch);
jsd's head copy (`whole_copy`) is the whole head.

The worker below is this file run by `accelerate launch`; rank 0 writes what it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"


@pytest.mark.integration
@pytest.mark.parametrize("config", ["cpu-fsdp.yaml", "cpu-zero3.yaml"])
def test_a_sharded_teacher_scores_like_the_whole_one(tmp_path: Path, tiny_zoo, config: str) -> None:
    if config == "cpu-zero3.yaml":
        pytest.importorskip("deepspeed")
    out = tmp_path / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTILL_WORKSPACE": str(tmp_path)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config)]
    proc = subprocess.run(
        [*cmd, __file__, str(tiny_zoo.teacher), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text())
    for rank in got:
        assert rank["passes"] == [3, 1][rank["rank"]]
        assert rank["sharded"] is True
        assert 0.5 <= rank["bytes_share"] <= 0.55, rank  # half of the weights a rank
        assert rank["logprobs_diff"] < 1e-5 and rank["topk_logps_diff"] < 1e-5, rank
        assert rank["topk_ids_equal"] is True and rank["states_diff"] < 1e-5, rank
        assert rank["head_copy_diff"] == 0.0, rank


def _worker(teacher: str, out: str) -> None:
    import torch

    from distill import launch

    launch.init_distributed()
    from distill.engines.hf import HFEngine
    from distill.kernels.sharded import inference_sharded, shard_for_inference, whole_copy

    whole = HFEngine.load(teacher)
    sharded = HFEngine.load(teacher)
    sharded.model = shard_for_inference(sharded.model, launch.strategy())
    rank = launch.rank()
    rows = 3 if rank == 0 else 1  # a pass a row: the ranks need 3 and 1 scoring passes
    gen = torch.Generator().manual_seed(rank)
    prompts = [torch.randint(3, 300, (5 + i,), generator=gen).tolist() for i in range(rows)]
    completions = [torch.randint(3, 300, (7 - i,), generator=gen).tolist() for i in range(rows)]
    ref = whole.score(prompts, completions, top_k=4, states=True)
    got = sharded.score(prompts, completions, batch_size=1, top_k=4, states=True)
    assert ref.topk_ids_B_T_K is not None and got.topk_ids_B_T_K is not None
    assert ref.topk_logprobs_B_T_K is not None and got.topk_logprobs_B_T_K is not None
    assert ref.states_B_T_H is not None and got.states_B_T_H is not None
    head = whole_copy(sharded.model.get_output_embeddings().weight)
    result = {
        "rank": rank,
        "passes": rows,
        "sharded": inference_sharded(sharded.model),
        "bytes_share": sharded.describe()["param_bytes"] / whole.describe()["param_bytes"],
        "logprobs_diff": float((ref.logprobs_B_T - got.logprobs_B_T).abs().max()),
        "topk_logps_diff": float((ref.topk_logprobs_B_T_K - got.topk_logprobs_B_T_K).abs().max()),
        "topk_ids_equal": bool(torch.equal(ref.topk_ids_B_T_K, got.topk_ids_B_T_K)),
        "states_diff": float((ref.states_B_T_H - got.states_B_T_H).abs().max()),
        "head_copy_diff": float((head - whole.model.get_output_embeddings().weight).abs().max()),
    }
    import torch.distributed as dist

    gathered: list = [None] * launch.world_size()
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
