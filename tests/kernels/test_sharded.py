"""kernels/sharded.py over 2 CPU processes (gloo), under FSDP2 and DeepSpeed ZeRO-3 as accelerate
sets them up: the chunked head's gradients through `head_call` equal one process's on the whole
batch (the tiny student ties its head to its embedding), also when the head's group was sharded
when the loss started; `full_weights` lets rank 0 run forwards alone (what its evaluation does),
and training goes on sharded after it.

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


def _launch(tmp_path: Path, student: Path, config: str) -> dict:
    out = tmp_path / f"{config}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTILL_WORKSPACE": str(tmp_path)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config)]
    proc = subprocess.run(
        [*cmd, __file__, str(student), str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.integration
@pytest.mark.parametrize("config", ["cpu-fsdp.yaml", "cpu-zero3.yaml"])
def test_sharded_head_trains_like_one_process(tmp_path: Path, tiny_zoo, config: str) -> None:
    if config == "cpu-zero3.yaml":
        pytest.importorskip("deepspeed")
    got = _launch(tmp_path, tiny_zoo.student, config)
    assert got["sharded"] in ("fsdp", "zero3")
    assert got["head_rows_outside_forward"] != got["vocab"]  # the head really was a shard
    # Both losses (head group unsharded by the forward, then sharded before the loss) and the
    # gradient of every weight, the tied head/embedding included, as one process computes them.
    for case in ("after_forward", "head_resharded"):
        assert got[case]["loss_diff"] < 1e-6, got
        assert got[case]["grad_diff"] < 1e-6, got
    assert got["rank0_alone_logits_diff"] < 1e-6, got
    assert got["trained_after"] is True
    # Every weight's part on each rank is its rows of the whole (local_shard == shard_of), and
    # the parts gather back to the whole, bit for bit (what OPSD's sharded EMA teacher relies on).
    assert got["shard_of_diff"] == 0.0 and got["gathered_diff"] == 0.0, got
    assert got["parts_smaller"] is True, got


def _worker(student: str, out: str) -> None:
    import torch

    from distill import launch

    launch.init_distributed()
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from distill.kernels.heads import select_positions, token_logprobs
    from distill.kernels.sharded import full_weights, head_call, sharding_of, track_optimizer
    from distill.kernels.states import decoder_states

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
    zero3 = launch.strategy() == "zero3"
    accelerator = Accelerator(cpu=not zero3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    if zero3:
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 2
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    module = accelerator.unwrap_model(wrapped)
    track_optimizer(module, optimizer)
    rank, world = launch.rank(), launch.world_size()
    ids_B_L = torch.randint(
        3, reference.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(1)
    )
    mine = slice(rank * 4 // world, (rank + 1) * 4 // world)

    def loss_of(net, ids, wrapper, head_model) -> torch.Tensor:
        mask = torch.ones_like(ids)
        hidden_N_H = select_positions(decoder_states(wrapper, ids, mask)[:, :-1], mask[:, 1:].bool())
        targets = ids[:, 1:].reshape(-1)
        if net == "head_resharded":  # the head's group sharded again before the loss reads it
            module.get_output_embeddings().reshard()
        logprobs = head_call(head_model, lambda h, w, b: token_logprobs(h, w, b, targets), hidden_N_H)
        return -logprobs.mean()

    def full_grads() -> dict[str, torch.Tensor]:
        if zero3:
            from deepspeed.utils import safe_get_full_grad

            return {name: safe_get_full_grad(p).clone() for name, p in module.named_parameters()}
        return {name: p.grad.full_tensor().clone() for name, p in module.named_parameters()}

    result: dict = {"sharded": sharding_of(module), "vocab": reference.config.vocab_size}
    result.update(_shard_round_trip(module, reference))
    head_weight = module.get_output_embeddings().weight
    result["head_rows_outside_forward"] = int(
        head_weight.to_local().shape[0] if hasattr(head_weight, "to_local") else head_weight.shape[0]
    )
    for case in ("after_forward", "head_resharded"):
        if zero3 and case == "head_resharded":  # ZeRO-3 holds no rows outside a forward anyway
            result[case] = result["after_forward"]
            continue
        reference.zero_grad()
        expected = -_ref_logprobs(reference, ids_B_L).mean()
        expected.backward()
        loss = loss_of(case, ids_B_L[mine], wrapped, module)
        # DeepSpeed's engine backward without the step accelerate's backward adds.
        (wrapped.backward if zero3 else accelerator.backward)(loss)
        losses = accelerator.gather(loss.detach()[None])
        grads = full_grads()
        result[case] = {
            "loss_diff": abs(float(losses.mean()) - float(expected)),
            "grad_diff": max(float((grads[n] - p.grad).abs().max()) for n, p in reference.named_parameters()),
        }
        optimizer.zero_grad()
    with full_weights(module):
        if rank == 0:
            with torch.no_grad():
                mask = torch.ones_like(ids_B_L)
                module.eval()
                first = module(input_ids=ids_B_L, attention_mask=mask).logits
                again = module(input_ids=ids_B_L, attention_mask=mask).logits
                plain = reference(input_ids=ids_B_L, attention_mask=mask).logits
                module.train()
            result["rank0_alone_logits_diff"] = max(
                float((first - plain).abs().max()), float((again - plain).abs().max())
            )
    loss = loss_of("after_forward", ids_B_L[mine], wrapped, module)
    accelerator.backward(loss)
    optimizer.step()
    result["trained_after"] = bool(torch.isfinite(loss).item())
    if rank == 0:
        Path(out).write_text(json.dumps(result))


def _shard_round_trip(module, reference) -> dict:
    import torch

    from distill.kernels.sharded import gather_shards, local_shard, shard_of

    whole = dict(reference.named_parameters())
    own, back, smaller = 0.0, 0.0, True
    with torch.no_grad():
        for name, param in module.named_parameters():
            part = shard_of(whole[name], param)
            own = max(own, float((local_shard(param).reshape(part.shape) - part).abs().max()))
            back = max(back, float((gather_shards(part, param) - whole[name]).abs().max()))
            smaller = smaller and local_shard(param).numel() < whole[name].numel()
    return {"shard_of_diff": own, "gathered_diff": back, "parts_smaller": smaller}


def _ref_logprobs(reference, ids_B_L):
    import torch

    from distill.kernels.heads import output_head, token_logprobs

    hidden = reference.model(input_ids=ids_B_L, attention_mask=torch.ones_like(ids_B_L)).last_hidden_state
    weight, bias = output_head(reference)
    return token_logprobs(
        hidden[:, :-1].reshape(-1, hidden.shape[-1]), weight, bias, ids_B_L[:, 1:].reshape(-1)
    )


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
