"""OPD's rollout sampling: distill's lean batched sampler (engines/batched.py, what the OPD
trainer samples with) against TRL's way (`model.generate` with the trainer's GenerationConfig, as
GRPOTrainer._generate_single_turn calls it) and a plain-PyTorch floor this file writes itself (a
KV-cached loop through the model call, sampling as `generate` does, no logits processors).

The preset's shape: `--prompts` x `--samples` rows of the domain's train prompts, up to
`--max-new-tokens`, rollout temperature 0.3. The three take turns in rounds (order rotated each
round) in this process; each reports the median seconds per batch after `--warmup` rounds, and
the ratios to `generate`. Same seed before each side: the rows each samples are compared too.

    python benchmarks/rollout_sampling.py --model zoo:student --rounds 12
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def floor_sampler(model: Any, pad: int, eos: set[int]) -> Callable[..., list[list[int]]]:
    """The floor: prefill, then one model call per token with a DynamicCache; temperature sampling."""
    import torch
    from transformers import DynamicCache

    def run(rows: list[list[int]], budget: int, temperature: float) -> list[list[int]]:
        width = max(len(r) for r in rows)
        ids_B_S = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask_B_L = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        pos_B_S = (mask_B_L.cumsum(-1) - 1).clamp(min=0)
        out: list[list[int]] = [[] for _ in rows]
        live = [True] * len(rows)
        with torch.inference_mode():
            res = model(input_ids=ids_B_S, attention_mask=mask_B_L, position_ids=pos_B_S,
                        cache=DynamicCache(), use_cache=True, logits_to_keep=1)  # fmt: skip
            past, logits_B_V, pos_B = res.cache, res.logits[:, -1], pos_B_S[:, -1]
            for _ in range(budget):
                probs_B_V = torch.softmax(logits_B_V.float() / temperature, dim=-1)
                tokens_B = torch.multinomial(probs_B_V, 1)[:, 0]
                for i, tok in enumerate(tokens_B.tolist()):
                    if live[i]:
                        out[i].append(tok)
                        live[i] = tok not in eos
                if not any(live):
                    break
                mask_B_L = torch.cat([mask_B_L, torch.ones((len(rows), 1), dtype=torch.long)], 1)
                pos_B = pos_B + 1
                res = model(input_ids=tokens_B[:, None], attention_mask=mask_B_L, position_ids=pos_B[:, None],
                            cache=past, use_cache=True)  # fmt: skip
                past, logits_B_V = res.cache, res.logits[:, -1]
        return out

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="zoo:student")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch
    from transformers import GenerationConfig

    from distill.config import Sampling, domain_config
    from distill.domains import build_domain
    from distill.engines.batched import continue_many
    from distill.engines.hf import HFEngine
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    torch.set_num_threads(args.threads)
    config = domain_config("rlve")
    engine = HFEngine.load(resolve_model(args.model, config, get_settings()))
    tok, eos, budget = engine.tokenizer, engine.eos_ids, args.max_new_tokens
    items = build_domain(config).train_items()[: args.prompts]
    rows = [engine.prompt_ids(item.prompt) for item in items for _ in range(args.samples)]
    n = len(rows)
    # TRL's HF path: left-padded ids and GenerationConfig as GRPOTrainer builds it (top_k=0 as distill sets).
    gen_config = GenerationConfig(max_new_tokens=budget, do_sample=True, pad_token_id=tok.pad_token_id,
                                  eos_token_id=sorted(eos), temperature=args.temperature, top_p=1.0,
                                  top_k=0, repetition_penalty=1.0, disable_compile=True)  # fmt: skip
    width = max(len(r) for r in rows)
    ids_B_S = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask_B_S = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()

    def generate() -> list[list[int]]:
        with torch.no_grad():
            out = engine.model.generate(
                input_ids=ids_B_S, attention_mask=mask_B_S, generation_config=gen_config
            )
        return [engine.completion(r, eos).ids for r in out[:, width:].tolist()]

    def lean() -> list[list[int]]:
        done = continue_many(engine, rows, [None] * n, [budget] * n, Sampling(budget, args.temperature))
        assert done is not None
        return [completion.ids for completion, _ in done]

    floor = floor_sampler(engine.model, tok.pad_token_id, eos)
    sides: dict[str, Callable[[], list[list[int]]]] = {
        "generate (TRL's way)": generate,
        "distill lean sampler": lean,
        "floor (model call loop)": lambda: floor(rows, budget, args.temperature),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    same: dict[str, int] = {name: 0 for name in sides}
    names = list(sides)
    for r in range(args.rounds):
        outs: dict[str, list[list[int]]] = {}
        for name in names[r % 3 :] + names[: r % 3]:
            torch.manual_seed(r)
            start = time.perf_counter()
            outs[name] = sides[name]()
            if r >= args.warmup:
                times[name].append(time.perf_counter() - start)
        for name in names:
            same[name] += int(outs[name] == outs[names[0]])
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    base = statistics.median(times[names[0]])
    print(f"\n{n} rows, up to {budget} new tokens, temperature {args.temperature}, {args.threads} thread(s)")
    print(f"{'side':<26} {'median s/batch':>14} {'ratio':>6} {'rows as generate':>17}")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:<26} {med:>14.3f} {med / base:>6.2f} {same[name]:>10}/{args.rounds} rounds")


if __name__ == "__main__":
    main()
