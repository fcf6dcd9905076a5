"""Build zoo entries: train tokenizers and tiny models locally, cache them by recipe hash."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import registry
from distill.config import OPSD_TEMPLATE, EvalConfig
from distill.domains import build_domain
from distill.engines.base import encode_text, render_chat
from distill.engines.hf import HFEngine
from distill.evals import evaluator_for
from distill.progress import hf_bars_off, progress_bar
from distill.tokenizer_bridge.anchor import encode_after
from distill.zoo.batches import Example, step_loss
from distill.zoo.notices import build_notice, built_notice, remove_stale_builds
from distill.zoo.recipes import (
    BUILD_VERSION,
    ModelRecipe,
    Recipe,
    TokenizerRecipe,
    ZooEntry,
    recipes_for,
)
from distill.zoo.tokenizers import SHIPPED, shipped_tokenizer, train_tokenizer

if TYPE_CHECKING:
    from distill.config import DomainBase
    from distill.domains.base import Domain

# Domain settings that change the data a zoo model is trained on.
_DATA_FIELDS = (
    "name",
    "environments",
    "parameters",
    "tasks",
    "train_on_dev",
    "gold_look",
    "train_size",
    "eval_size",
    "eval_seed",
    # dapo: the training source and the embedded generator's settings.
    "data",
    "seed",
    "min_steps",
    "max_steps",
    "max_value",
    # a mixed domain: its parts' sections and their weights.
    "parts",
    "mix",
)
# `<name>@<domain>` in a mixed zoo: the named model of one part, trained on that part's data with the
# mix's tokenizer (so each domain's teacher shares the mixed student's vocabulary).
PART = "@"


_ADDED_FIELDS = {
    "max_positions": 1024,
    "episode_loss": "turns",
    "vocab_size": None,
    "privileged_share": 0.0,
    "privileged_items": None,
    "privileged_every_turn": False,
    "pack": False,
    "share_prefix": False,
    "detour_share": 0.0,
}


def zoo_domain(domain: DomainBase) -> DomainBase:
    """The domain config the zoo's models learn from: the run's, with the fields that name a
    user's own problems (a domain's `user_data_fields`: dapo's `data`, its eval benchmark) back at
    the domain's defaults. A user's problems rarely carry worked solutions, and the embedded
    models are the domain's own: the run trains and evaluates on the user's items with them. A
    mixed domain: each part's."""
    parts: dict[str, DomainBase] | None = getattr(domain, "parts", None)
    if parts:
        return domain.model_copy(update={"parts": {p: zoo_domain(c) for p, c in parts.items()}})
    fields = type(domain).model_fields
    reset = {f: fields[f].default for f in getattr(domain, "user_data_fields", ()) if f in fields}
    return domain.model_copy(update=reset) if reset else domain


def _lookup(name: str, recipes: Mapping[str, Recipe]) -> Recipe:
    """The recipe of `name` (refused before any folder or lock of it exists)."""
    try:
        return recipes[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(sorted(recipes))}") from None


def _target(
    name: str, domain: DomainBase, recipes: Mapping[str, Recipe] | None
) -> tuple[Recipe, DomainBase, Mapping[str, Recipe]]:
    """(recipe, the domain config it trains on, the recipes its tokenizer comes from) of `name`
    in `domain`'s zoo; `<name>@<part>` in a mixed zoo trains on that part with the mix's tokenizer."""
    domain = zoo_domain(domain)
    base, _, part = name.partition(PART)
    if not part:
        recipes = recipes if recipes is not None else recipes_for(domain.name)
        return _lookup(name, recipes), domain, recipes
    parts: dict[str, DomainBase] = getattr(domain, "parts", {})
    if part not in parts:
        raise ValueError(f"zoo model {name!r}: {part} is not a domain of the mixed zoo {domain.name!r}")
    return _lookup(base, recipes_for(part)), parts[part], recipes_for(domain.name)


def recipe_key(name: str, domain: DomainBase, recipes: Mapping[str, Recipe] | None = None) -> str:
    recipe, data_config, tokenizer_recipes = _target(name, domain, recipes)
    data = data_config.data_key(set(_DATA_FIELDS))
    dump = recipe.model_dump()
    # Fields added after the first builds: at their defaults they leave existing keys unchanged.
    for added, default in _ADDED_FIELDS.items():
        if added in dump and dump[added] == default:
            del dump[added]
    parts: dict[str, Any] = {"recipe": dump, "data": data, "version": BUILD_VERSION}
    if isinstance(recipe, ModelRecipe):
        parts["tokenizer"] = recipe_key(recipe.tokenizer, domain, tokenizer_recipes)
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def entry_dir(root: Path, name: str, domain: DomainBase, recipes: Mapping[str, Recipe] | None = None) -> Path:
    return root / domain.name / f"{name}-{recipe_key(name, domain, recipes)}"


def read_entry(path: Path) -> ZooEntry | None:
    meta = path / "zoo.json"
    if not meta.exists():
        return None
    return ZooEntry.model_validate_json(meta.read_text())


def save_model(model: Any, tokenizer: Any, out: Path) -> None:
    """Save a built model without transformers' "Writing model shards" bar in the build's output."""
    with hf_bars_off():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)


def ensure_built(
    root: Path,
    name: str,
    domain_config: DomainBase,
    show_progress: bool = True,
    recipes: Mapping[str, Recipe] | None = None,
) -> Path:
    """Path of the built entry; builds it (and what it depends on) on first use.
    `recipes` None: the domain's (`recipes_for`)."""
    from filelock import FileLock

    domain_config = zoo_domain(domain_config)
    recipe, data_config, tokenizer_recipes = _target(name, domain_config, recipes)
    target = entry_dir(root, name, domain_config, recipes)
    lock = Path(str(target) + ".lock")
    if (target / "zoo.json").exists():
        # Once the entry exists nobody needs its lock: whoever still waits on it finds zoo.json.
        lock.unlink(missing_ok=True)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        if (target / "zoo.json").exists():
            return target
        remove_stale_builds(target)
        tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
        tmp.mkdir(parents=True)
        if show_progress:
            notice = build_notice(root, name, domain_config, target, _DATA_FIELDS)
            print(notice, file=sys.stderr, flush=True)
        try:
            entry = _build_into(
                tmp, root, name, recipe, (data_config, domain_config), tokenizer_recipes, show_progress
            )
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a SIGKILL cannot get here: remove_stale_builds
            raise
        # The rename is the commit point: a killed build leaves only a tmp folder behind.
        os.replace(tmp, target)
    lock.unlink(missing_ok=True)
    if show_progress:
        print(built_notice(entry), file=sys.stderr, flush=True)
    return target


def _build_into(
    tmp: Path,
    root: Path,
    name: str,
    recipe: Recipe,
    configs: tuple[DomainBase, DomainBase],
    recipes: Mapping[str, Recipe],
    show_progress: bool,
) -> ZooEntry:
    """Build one entry into `tmp` (its tokenizer first, for a model) and write its zoo.json.
    `configs`: the domain it trains on, and the zoo's (they differ for a part of a mixed zoo)."""
    data_config, domain_config = configs
    start = time.time()
    domain = build_domain(data_config)
    if isinstance(recipe, TokenizerRecipe):
        extra = _build_tokenizer(recipe, domain, tmp)
    else:
        tok_dir = ensure_built(root, recipe.tokenizer, domain_config, show_progress, recipes)
        extra = _build_model(name, recipe, domain, tok_dir, tmp, show_progress)
    entry = ZooEntry(
        name=name,
        domain=domain_config.name,
        key=recipe_key(name, domain_config, recipes),
        recipe=recipe.model_dump(),
        seconds=round(time.time() - start, 2),
        **extra,
    )
    (tmp / "zoo.json").write_text(entry.model_dump_json(indent=2))
    return entry


def _build_tokenizer(recipe: TokenizerRecipe, domain: Domain, out: Path) -> dict[str, Any]:
    if recipe.family == "qwen3":  # the real vocabulary: nothing to learn from the domain
        from distill.zoo.qwen_vocab import build_qwen_tokenizer

        return {"params": 0, "vocab": len(build_qwen_tokenizer(out))}

    if recipe.family in SHIPPED:  # a real vocabulary a package ships: nothing to learn either
        tok = shipped_tokenizer(recipe.family)
    else:
        tok = train_tokenizer(recipe.family, domain.corpus(), recipe.vocab_size)
    tok.save_pretrained(out)
    return {"params": 0, "vocab": len(tok)}


def make_model(recipe: ModelRecipe, tokenizer: Any) -> Any:
    """A freshly initialised model of the recipe's architecture and size for `tokenizer`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=recipe.vocab_size or len(tokenizer),
        hidden_size=recipe.hidden,
        intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    if recipe.arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
        if recipe.vocab_size:  # Qwen3's own generation config ends at <|im_end|> or <|endoftext|>
            model.generation_config.eos_token_id = sorted({tokenizer.eos_token_id, tokenizer.pad_token_id})
        return model
    if recipe.arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    raise ValueError(f"zoo recipe: unknown arch {recipe.arch!r}")


def supervised_examples(
    tokenizer: Any,
    domain: Domain,
    items: list[Any],
    corrupt_prob: float = 0.0,
    seed: int = 0,
    privileged_share: float = 0.0,
    privileged_pool: list[Any] | None = None,
) -> list[Example]:
    """(input_ids, labels) with labels -100 on the prompt: CE on the assistant response only.

    With `corrupt_prob`, that share of examples carries one wrong intermediate step whose tokens
    are masked from the loss (see `Domain.solution_segments`). With `privileged_share`, that share
    of items is also seen once with OPSD's privileged prompt (the reference template around the
    problem and its privileged context), so the model can read the view an OPSD teacher gets;
    those items come from `privileged_pool` where given, else from `items`.
    """
    import random

    rng = random.Random(seed)
    examples = []
    # No draw at share 0: existing recipes' examples (and corruptions) stay exactly as they were.
    pool = items if privileged_pool is None else privileged_pool
    privileged = [item for item in pool if privileged_share and rng.random() < privileged_share]
    views = [(item, item.prompt) for item in items] + [
        (item, domain.privileged_message(OPSD_TEMPLATE, item)) for item in privileged
    ]
    for item, prompt_text in views:
        prompt = encode_text(tokenizer, render_chat(tokenizer, prompt_text))
        if corrupt_prob and rng.random() < corrupt_prob:
            response: list[int] = []
            labels: list[int] = []
            for text, trainable in domain.solution_segments(item, rng):
                # Each segment written where it stands, after the ones before it: alone, a
                # sentencepiece model puts its dummy `▁` (a space) before every segment.
                ids = encode_after(tokenizer, text, response).ids
                response += ids
                labels += ids if trainable else [-100] * len(ids)
        else:
            response = encode_text(tokenizer, item.solution)
            labels = list(response)
        response.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
        examples.append((prompt + response, [-100] * len(prompt) + labels))
    return examples


def _build_model(
    name: str, recipe: ModelRecipe, domain: Domain, tok_dir: Path, out: Path, show_progress: bool
) -> dict[str, Any]:
    """Train the recipe's model on the domain's worked solutions (an episodic domain: its gold
    episodes), evaluate it as a run would, save it; returns what zoo.json records of it."""
    import torch
    from transformers import AutoTokenizer

    torch.manual_seed(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model = make_model(recipe, tokenizer)
    try:
        if registry.domain_entry(domain.name).episodic:
            from distill.zoo.episodes import agent_examples

            examples, batch_size, extra = agent_examples(domain, name, recipe, tokenizer)
        else:
            examples, batch_size, extra = (
                _solution_examples(domain, name, recipe, tokenizer),
                recipe.batch_size,
                {},
            )
        label = f"zoo: training {name} ({domain.name})"
        loss_value = fit_examples(model, tokenizer, examples, recipe, batch_size, label, show_progress)
        evaluate = evaluator_for(domain)
        result = evaluate(
            HFEngine(model, tokenizer),
            domain,
            domain.eval_items(),
            EvalConfig(),
            f"zoo: eval {name}",
            show_progress,
        )
    finally:
        domain.close()
    save_model(model, tokenizer, out)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": None if math.isnan(loss_value) else round(loss_value, 4),
        **extra,
        # Per task too where the domain has tasks (`task/<id>/success`): a mean can hide one never solved.
        "eval": {k: round(v, 4) for k, v in result.metrics.items()},
    }


def _solution_examples(domain: Domain, name: str, recipe: ModelRecipe, tokenizer: Any) -> list[Example]:
    items = domain.train_items()
    pool = None
    if recipe.privileged_items is not None:
        pool = [i for i in items[: recipe.privileged_items] if i.solution]
    examples = supervised_examples(
        tokenizer,
        domain,
        [i for i in items[: recipe.data_items] if i.solution],
        recipe.corrupt_prob,
        recipe.seed,
        recipe.privileged_share,
        pool,
    )
    if not examples:
        raise ValueError(f"zoo {name}: the domain gave no worked solutions to train on")
    return examples


def fit_examples(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    recipe: ModelRecipe,
    batch_size: int,
    label: str,
    show_progress: bool,
) -> float:
    """The zoo's supervised loop: AdamW, warmup + cosine to 10%, CE on the labelled tokens.
    Returns the last loss; leaves the model in eval mode with its generation ids set."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        frac = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(recipe.seed)
    model.train()
    loss_value = float("nan")
    with progress_bar(label, total=recipe.steps, enabled=show_progress) as advance:
        for _ in range(recipe.steps):
            idx = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
            batch = [examples[i] for i in idx]
            loss = step_loss(model, batch, recipe, tokenizer.pad_token_id)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            loss_value = float(loss.detach())
            advance(1)
    model.eval()
    if not isinstance(model.generation_config.eos_token_id, list):  # a recipe's own list stays
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return loss_value
