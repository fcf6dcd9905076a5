"""Rollout and teacher-scoring throughput: a vLLM server (the `server` engine) vs the hf engine,
on the same model, the same prompts and the same token budget.

Rollout tokens/s = generated tokens (EOS included) / wall time of one `generate` over the batch;
scoring tokens/s = completion tokens scored / wall time of one `score` of those completions (what
OPD's teacher does every step). Both engines run fp32 on CPU with the same thread count; the
server runs in its own process (started here from the vLLM venv, `scripts/vllm-env.sh`), so its
numbers include HTTP and JSON. Sampling at temperature 1, so lengths differ run to run: compare
rates, not times.

    python benchmarks/rollout_engines.py                       # zoo:teacher, 32 prompts x 64 tokens
    python benchmarks/rollout_engines.py --model zoo:teacher --prompts 64 --max-new-tokens 128 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from distill.config import Sampling


def _rates(engine: Any, prompts: list[list[int]], max_new_tokens: int, rounds: int) -> dict[str, float]:
    gen, score = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        completions = engine.generate(prompts, Sampling(max_new_tokens, 1.0), batch_size=len(prompts))
        gen_s = time.perf_counter() - start
        ids = [c.ids for c in completions]
        tokens = sum(len(c) for c in ids)
        start = time.perf_counter()
        engine.score(prompts, ids, batch_size=len(prompts))
        score_s = time.perf_counter() - start
        gen.append(tokens / gen_s)
        score.append(tokens / score_s)
    return {"rollout_tokens_per_s": statistics.median(gen), "scoring_tokens_per_s": statistics.median(score)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="zoo:teacher", help="zoo:<name> or a local model folder")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (hf) = OMP threads (vLLM)")
    parser.add_argument("--port", type=int, default=8177)
    args = parser.parse_args()

    import torch

    from distill.config import ServerClientConfig
    from distill.domains import build_domain
    from distill.domains.rlve.config import RLVEDomainConfig
    from distill.engines.hf import HFEngine
    from distill.engines.server import ServerEngine
    from distill.engines.vllm_server import ServeOptions, start_server, stop_server, wait_ready
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    domain_cfg = RLVEDomainConfig()
    path = resolve_model(args.model, domain_cfg, get_settings())
    torch.set_num_threads(args.threads)
    hf = HFEngine.load(path)
    items = build_domain(domain_cfg).eval_items()[: args.prompts]
    prompts = [hf.prompt_ids(item.prompt) for item in items]
    hf.generate(prompts[:2], Sampling(4))  # warm-up
    results: dict[str, Any] = {"hf": _rates(hf, prompts, args.max_new_tokens, args.rounds)}

    log = Path(tempfile.mkdtemp()) / "vllm.log"
    opts = ServeOptions(port=args.port, precision="fp32", max_model_len=1024)
    start = time.perf_counter()
    proc = start_server(path, opts, log, threads=args.threads)
    try:
        url = f"http://127.0.0.1:{args.port}"
        wait_ready(url, proc, timeout_s=600, log=log)
        startup_s = time.perf_counter() - start
        # One request for the whole batch, as hf's one generate call: vLLM batches it itself.
        client = ServerClientConfig(batch_size=len(prompts), concurrency=1, timeout_s=600)
        server = ServerEngine.load(path, url, client)
        server.generate(prompts[:2], Sampling(4))  # warm-up
        results["server"] = _rates(server, prompts, args.max_new_tokens, args.rounds)
        results["server"]["startup_s"] = startup_s
    finally:
        stop_server(proc)

    results["setup"] = {
        "model": args.model,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
    }
    print(f"{'engine':<8}{'rollout tok/s':>15}{'scoring tok/s':>15}")
    for name in ("hf", "server"):
        r = results[name]
        print(f"{name:<8}{r['rollout_tokens_per_s']:>15.0f}{r['scoring_tokens_per_s']:>15.0f}")
    print(f"server startup: {results['server']['startup_s']:.0f} s")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
