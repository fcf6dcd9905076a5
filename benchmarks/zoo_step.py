"""A zoo training step on SciWorld-shaped episodes: distill's shared prefix (`share_prefix`,
distill/zoo/batches.py) against padded rows through the model call (the plain-PyTorch floor this
file writes itself) and TRL's `SFTTrainer.training_step` on the same examples.

Every episode of the embedded SciWorld default starts with the same ~554 tokens (the AgentGym
instruction, the action list and the first turns) and goes on for ~170-740 more; CE on every
token, as the sciworld teacher trains (`episode_loss="all"`). The examples here are that shape:
one random prefix, random tails whose lengths are drawn from that range, the teacher's shape
(d128 x 2, vocabulary 1024). The three sides take turns in rounds (order rotated each round),
each a forward, backward and AdamW step on its own copy of the same initial weights; each reports
the median seconds per step after `--warmup` rounds and its ratio to TRL's. The losses of round 1
are printed too: one objective, three layouts.

    python benchmarks/zoo_step.py --batch 4 --rounds 10
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def episodes(
    batch: int, prefix: int, tails: tuple[int, int], vocab: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(5, vocab, (prefix,), generator=gen).tolist()
    out = []
    for _ in range(batch):
        n = int(torch.randint(tails[0], tails[1] + 1, (1,), generator=gen))
        ids = shared + torch.randint(5, vocab, (n,), generator=gen).tolist()
        out.append((ids, list(ids)))
    return out


def trl_side(
    model: Any, tokenizer: Any, examples: list[tuple[list[int], list[int]]], out: Path
) -> Callable[[], float]:
    """TRL's SFT step: its collator pads the rows, `training_step` runs forward, backward; then
    its optimizer steps, as `train()` does between steps."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(out), per_device_train_batch_size=len(examples), learning_rate=5e-3,
                     report_to=[], packing=False, max_length=None, use_cpu=True,
                     dataloader_num_workers=0, save_strategy="no", logging_strategy="no")  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, processing_class=tokenizer,
                         train_dataset=Dataset.from_list([{"input_ids": ids} for ids, _ in examples]))  # fmt: skip
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.current_gradient_accumulation_steps = 1  # what `train()` sets before its first step
    inputs = next(iter(trainer.get_train_dataloader()))

    def step() -> float:
        loss = trainer.training_step(trainer.model, inputs)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prefix", type=int, default=554)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch
    from transformers import AutoTokenizer

    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo.batches import padded_batch, shared_prefix_loss
    from distill.zoo.build import ensure_built, make_model
    from distill.zoo.recipes import recipes_for

    torch.set_num_threads(args.threads)
    tok_dir = ensure_built(get_settings().zoo_path, "tok-qwen", domain_config("rlve"))
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    recipe = recipes_for("sciworld")["teacher"]
    torch.manual_seed(0)
    base = make_model(recipe, tokenizer).train()
    examples = episodes(args.batch, args.prefix, (170, 740), len(tokenizer), seed=1)
    pad = tokenizer.pad_token_id

    def plain_side(loss_of: Callable[[Any], torch.Tensor]) -> Callable[[], float]:
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=5e-3, betas=(0.9, 0.95), weight_decay=0.0)

        def step() -> float:
            loss = loss_of(model)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss)

        return step

    padded = padded_batch(examples, pad)
    with tempfile.TemporaryDirectory() as out:
        sides: dict[str, Callable[[], float]] = {
            "TRL SFTTrainer step": trl_side(copy.deepcopy(base), tokenizer, examples, Path(out)),
            "floor (padded rows)": plain_side(lambda m: m(**padded, use_cache=False).loss),
            "distill shared prefix": plain_side(lambda m: shared_prefix_loss(m, examples, pad)),
        }
        names = list(sides)
        times: dict[str, list[float]] = {name: [] for name in names}
        first: dict[str, float] = {}
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                start = time.perf_counter()
                loss = sides[name]()
                if r >= args.warmup:
                    times[name].append(time.perf_counter() - start)
                first.setdefault(name, loss)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    tokens = sum(len(ids) for ids, _ in examples)
    print(f"\n{args.batch} episodes, {tokens} tokens ({args.prefix} shared by all), {args.threads} thread(s)")
    print(f"{'side':<24} {'median s/step':>13} {'ratio':>6} {'round-1 loss':>13}")
    ref = statistics.median(times[names[0]])
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:<24} {med:>13.3f} {med / ref:>6.2f} {first[name]:>13.4f}")


if __name__ == "__main__":
    main()
