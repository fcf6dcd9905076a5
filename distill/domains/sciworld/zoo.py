"""The embedded SciWorld agents: tiny models trained on the simulator's gold episodes.

Each training row is one whole gold episode in the AgentGym format (the same token sequence a
live episode has), with CE on the gold turns only. The teacher is trained on all training
items; the student (a smaller recipe with `data_items`) on a small slice, so it starts weak.
The built model is scored by playing its domain's eval items on the simulator pool.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distill.domains.sciworld import SciWorldDomain
    from distill.zoo.recipes import ModelRecipe


def build_agent(
    domain: SciWorldDomain,
    name: str,
    recipe: ModelRecipe,
    tok_dir: Path,
    out: Path,
    show_progress: bool,
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from distill.engines.hf import HFEngine
    from distill.evals.agent import AgentEvalConfig, evaluate_agent, frame_for
    from distill.methods.episodes import gold_examples
    from distill.progress import progress_bar
    from distill.zoo.build import _make_model

    torch.manual_seed(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model = _make_model(recipe, tokenizer)
    items = [i for i in domain.train_items() if i.meta.get("steps")]
    if recipe.data_items is not None:
        # The student's warm start is a slice; episode sets are small (a few hundred), so the
        # slice is also at most an eighth of them, or the student would not start weak.
        items = items[: min(recipe.data_items, max(1, len(items) // 8))]
    if not items:
        raise ValueError(f"zoo {name}: no sciworld training item has a gold trajectory")
    examples = gold_examples(items, tokenizer, frame_for(tokenizer, None))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        frac = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(recipe.seed)
    # Episodes are long (~1-2k tokens): batches of a few episodes, same number of updates.
    batch_size = max(1, min(recipe.batch_size, 8))
    model.train()
    loss_value = float("nan")
    with progress_bar(
        f"zoo: training {name} (sciworld)", total=recipe.steps, enabled=show_progress
    ) as advance:
        for _ in range(recipe.steps):
            idx = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
            batch = [examples[i] for i in idx]
            width = max(len(ids) for ids, _ in batch)
            ids_B_T = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
            labels_B_T = torch.full((len(batch), width), -100, dtype=torch.long)
            mask_B_T = torch.zeros((len(batch), width), dtype=torch.long)
            for row, (ids, labels) in enumerate(batch):
                ids_B_T[row, : len(ids)] = torch.tensor(ids)
                labels_B_T[row, : len(labels)] = torch.tensor(labels)
                mask_B_T[row, : len(ids)] = 1
            loss = model(input_ids=ids_B_T, attention_mask=mask_B_T, labels=labels_B_T).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            loss_value = float(loss.detach())
            advance(1)
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    cfg = domain.config
    result = evaluate_agent(
        HFEngine(model, tokenizer),
        domain,
        domain.eval_items(),
        AgentEvalConfig(
            max_turns=cfg.max_turns,
            turn_max_new_tokens=cfg.turn_max_new_tokens,
            negative_score=cfg.negative_score,
        ),
        label=f"zoo: eval {name}",
        show_progress=show_progress,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    lengths = [len(ids) for ids, _ in examples]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": round(loss_value, 4),
        "train_episodes": len(examples),
        "episode_tokens_mean": round(sum(lengths) / len(lengths), 1),
        "eval": {k: round(v, 4) for k, v in result.metrics.items() if not k.startswith("task/")},
    }
