"""Zoo builds: cached by recipe hash, metadata in zoo.json, loadable with plain transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import TINY_RECIPES, tiny_domain

from distill.domains.base import Item, cached_items
from distill.domains.rlve.config import RLVEDomainConfig
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.zoo import resolve_model
from distill.zoo.build import ensure_built, entry_dir, read_entry, recipe_key
from distill.zoo.recipes import ModelRecipe, TokenizerRecipe


def _mtime(path: Path) -> int:
    return (path / "zoo.json").stat().st_mtime_ns


def test_second_build_reuses_the_entry(tiny_zoo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    before = {p: _mtime(p) for p in (tiny_zoo.teacher, tiny_zoo.student, tiny_zoo.tok_qwen)}

    def no_rebuild(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the cached entry was rebuilt")

    # A cache hit must not even build the domain.
    monkeypatch.setattr("distill.domains.build_domain", no_rebuild)
    for name, path in (
        ("teacher", tiny_zoo.teacher),
        ("student", tiny_zoo.student),
        ("tok-qwen", tiny_zoo.tok_qwen),
    ):
        again = ensure_built(tiny_zoo.root, name, tiny_zoo.domain, show_progress=False, recipes=TINY_RECIPES)
        assert again == path
    assert {p: _mtime(p) for p in before} == before


def test_fresh_tokenizer_build_then_cache_hit(tmp_path: Path) -> None:
    recipes = {"tok": TokenizerRecipe(family="llama", vocab_size=300)}
    domain = RLVEDomainConfig(train_size=8, eval_size=4)
    path = ensure_built(tmp_path, "tok", domain, show_progress=False, recipes=recipes)
    assert path == entry_dir(tmp_path, "tok", domain, recipes)
    assert path.parent == tmp_path / "rlve"
    assert path.name == f"tok-{recipe_key('tok', domain, recipes)}"
    entry = read_entry(path)
    assert entry is not None and entry.name == "tok" and entry.domain == "rlve"
    assert entry.recipe == recipes["tok"].model_dump()
    stamp = _mtime(path)
    assert ensure_built(tmp_path, "tok", domain, show_progress=False, recipes=recipes) == path
    assert _mtime(path) == stamp
    # The commit is a rename: no temporary folder is left behind.
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    assert entry.model_extra is not None and entry.model_extra["vocab"] == len(tok)
    assert tok.eos_token == "<|eot_id|>"
    text = "What is 12345 times 9? 世界 😀"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_key_depends_on_recipe_tokenizer_and_data(tiny_zoo: Any) -> None:
    domain = tiny_zoo.domain
    base = recipe_key("teacher", domain, TINY_RECIPES)
    assert base == recipe_key("teacher", domain, TINY_RECIPES)  # stable
    assert entry_dir(tiny_zoo.root, "teacher", domain, TINY_RECIPES) == tiny_zoo.teacher

    teacher = TINY_RECIPES["teacher"]
    assert isinstance(teacher, ModelRecipe)
    more_steps = dict(TINY_RECIPES, teacher=teacher.model_copy(update={"steps": teacher.steps + 1}))
    assert recipe_key("teacher", domain, more_steps) != base
    assert entry_dir(tiny_zoo.root, "teacher", domain, more_steps) != tiny_zoo.teacher
    # A field added to recipes later keeps old keys at its default and re-keys when set.
    same = dict(TINY_RECIPES, teacher=teacher.model_copy(update={"episode_loss": "turns"}))
    assert recipe_key("teacher", domain, same) == base
    changed = dict(TINY_RECIPES, teacher=teacher.model_copy(update={"episode_loss": "all"}))
    assert recipe_key("teacher", domain, changed) != base
    for field, default, other in (
        ("privileged_share", 0.0, 0.5),
        ("privileged_items", None, 64),
        ("share_prefix", False, True),
    ):
        at_default = dict(TINY_RECIPES, teacher=teacher.model_copy(update={field: default}))
        assert recipe_key("teacher", domain, at_default) == base
        moved = dict(TINY_RECIPES, teacher=teacher.model_copy(update={field: other}))
        assert recipe_key("teacher", domain, moved) != base
    # Other entries are unaffected by the teacher's recipe.
    assert recipe_key("student", domain, more_steps) == recipe_key("student", domain, TINY_RECIPES)

    # A different tokenizer recipe changes every model built on it.
    tok = TINY_RECIPES["tok-qwen"]
    assert isinstance(tok, TokenizerRecipe)
    bigger_vocab = dict(TINY_RECIPES, **{"tok-qwen": tok.model_copy(update={"vocab_size": 401})})
    assert recipe_key("teacher", domain, bigger_vocab) != base
    assert recipe_key("tok-llama", domain, bigger_vocab) == recipe_key("tok-llama", domain, TINY_RECIPES)

    # Different training data, different entry.
    other_data = domain.model_copy(update={"train_size": domain.train_size + 1})
    assert recipe_key("teacher", other_data, TINY_RECIPES) != base
    other_params = domain.model_copy(
        update={"parameters": {"Sorting": {"N": 4}, "Multiplication": {"digit_num": 1}}}
    )
    assert recipe_key("teacher", other_params, TINY_RECIPES) != base


def test_a_bumped_data_version_rekeys_items_and_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A domain whose fixed code makes other items from the same config bumps `data_version`:
    an old workspace's items and zoo models are then not reused; at 0 keys stay as they were."""
    domain = tiny_domain()

    class Fixed(RLVEDomainConfig):
        data_version: ClassVar[int] = 2

    fixed = Fixed(**domain.model_dump())
    assert domain.data_key() == domain.model_dump(mode="json")
    assert recipe_key("teacher", fixed, TINY_RECIPES) != recipe_key("teacher", domain, TINY_RECIPES)
    assert recipe_key("tok-qwen", fixed, TINY_RECIPES) != recipe_key("tok-qwen", domain, TINY_RECIPES)

    monkeypatch.setenv("DISTILL_WORKSPACE", str(tmp_path))
    made: list[str] = []

    def make(tag: str) -> list[Item]:
        made.append(tag)
        return [Item(id=tag, prompt="p", answer="a")]

    assert cached_items(domain, "train", lambda: make("old"))[0].id == "old"
    assert cached_items(domain, "train", lambda: make("again"))[0].id == "old"  # reused
    assert cached_items(fixed, "train", lambda: make("fixed"))[0].id == "fixed"
    assert made == ["old", "fixed"]
    assert len(list((tmp_path / "data").glob("rlve-train-*.jsonl"))) == 2


def test_runtime_fields_leave_the_items_key_alone() -> None:
    """How sciworld episodes are played (pool, turn limit) does not re-key its items; which items
    there are does (and so does its bumped data_version)."""
    base = SciWorldDomainConfig()
    assert SciWorldDomainConfig(pool_size=4, max_turns=7).items_key() == base.items_key()
    assert SciWorldDomainConfig(train_size=3).items_key() != base.items_key()
    assert "pool_size" not in base.data_key() and base.data_key()["data_version"] == base.data_version


def test_zoo_json_records_params_and_eval(tiny_zoo: Any) -> None:
    from transformers import AutoModelForCausalLM

    raw = json.loads((tiny_zoo.teacher / "zoo.json").read_text())
    entry = read_entry(tiny_zoo.teacher)
    assert entry is not None
    assert entry.name == "teacher" and entry.domain == "rlve"
    assert entry.key == recipe_key("teacher", tiny_zoo.domain, TINY_RECIPES)
    assert entry.recipe == TINY_RECIPES["teacher"].model_dump()
    assert entry.seconds > 0
    model = AutoModelForCausalLM.from_pretrained(tiny_zoo.teacher)
    assert entry.params == sum(p.numel() for p in model.parameters()) > 0
    assert 0.0 <= entry.eval["accuracy"] <= 1.0
    assert entry.eval["items"] == tiny_zoo.domain.eval_size
    assert 0.0 <= entry.eval["truncation_rate"] <= 1.0
    assert "pass@1" in entry.eval
    assert math.isfinite(raw["final_loss"])
    tok_entry = read_entry(tiny_zoo.tok_qwen)
    assert tok_entry is not None and tok_entry.params == 0 and tok_entry.eval == {}


def test_built_model_loads_with_plain_transformers(tiny_zoo: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = TINY_RECIPES["student"]
    assert isinstance(recipe, ModelRecipe)
    model = AutoModelForCausalLM.from_pretrained(tiny_zoo.student)
    tok = AutoTokenizer.from_pretrained(tiny_zoo.student)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.hidden_size == recipe.hidden
    assert model.config.num_hidden_layers == recipe.layers
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tok.pad_token_id
    # The model directory carries the same tokenizer as its zoo tokenizer entry.
    zoo_tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    assert tok.get_vocab() == zoo_tok.get_vocab()
    assert tok.chat_template == zoo_tok.chat_template
    ids = torch.tensor([tok.encode("What is 2 times 3?", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()


def test_teacher_learned_something(tiny_zoo: Any) -> None:
    # Supervised training on the worked solutions: the teacher's loss ends far below uniform.
    raw = json.loads((tiny_zoo.teacher / "zoo.json").read_text())
    vocab = json.loads((tiny_zoo.tok_qwen / "zoo.json").read_text())["vocab"]
    assert raw["final_loss"] < 0.5 * math.log(vocab)


def test_llama_arch_build(tiny_zoo: Any) -> None:
    from transformers import AutoModelForCausalLM

    recipes = dict(
        TINY_RECIPES,
        **{
            "llama-mini": ModelRecipe(
                arch="llama",
                tokenizer="tok-llama",
                hidden=32,
                layers=1,
                heads=1,
                kv_heads=1,
                intermediate=64,
                steps=2,
                lr=1e-3,
                batch_size=4,
                data_items=8,
                warmup_steps=1,
            )
        },
    )
    path = ensure_built(tiny_zoo.root, "llama-mini", tiny_zoo.domain, show_progress=False, recipes=recipes)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    entry = read_entry(path)
    assert entry is not None and entry.params == sum(p.numel() for p in model.parameters())
    assert model.config.vocab_size == json.loads((tiny_zoo.tok_llama / "zoo.json").read_text())["vocab"]


def test_unknown_name_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown zoo model 'nope'") as info:
        ensure_built(
            tmp_path,
            "nope",
            RLVEDomainConfig(train_size=4, eval_size=2),
            show_progress=False,
            recipes=TINY_RECIPES,
        )
    assert "teacher" in str(info.value)  # lists the known names
    assert list(tmp_path.iterdir()) == []


def test_resolve_model_passes_non_zoo_names_through() -> None:
    from distill.settings import Settings

    settings = Settings(workspace=Path("/nonexistent"))
    for name in ("Qwen/Qwen3-1.7B", "/models/local", "runs/x/checkpoints/step-3"):
        assert resolve_model(name, RLVEDomainConfig(), settings) == name


def test_save_model_keeps_the_shard_bar_out_and_restores_it(
    tiny_zoo: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from distill.zoo.build import save_model

    model = AutoModelForCausalLM.from_pretrained(tiny_zoo.teacher)
    tok = AutoTokenizer.from_pretrained(tiny_zoo.teacher)
    hf_logging.enable_progress_bar()
    capfd.readouterr()
    model.save_pretrained(tmp_path / "plain")
    assert "Writing model shards" in capfd.readouterr().err  # what the build used to print
    save_model(model, tok, tmp_path / "quiet")
    assert "Writing model shards" not in capfd.readouterr().err
    assert (tmp_path / "quiet" / "config.json").exists() and (tmp_path / "quiet" / "tokenizer.json").exists()
    assert hf_logging.is_progress_bar_enabled()


def _prompt_text(tok: Any, ids: list[int], labels: list[int]) -> str:
    """The prompt of a supervised example: its tokens without a label."""
    return tok.decode([t for t, y in zip(ids, labels, strict=True) if y == -100])


def test_privileged_share_adds_opsd_views_of_some_items(tiny_zoo: Any) -> None:
    """A recipe's `privileged_share` adds, for that share of items, an example whose prompt is
    OPSD's teacher view (the reference template with the solution) and whose target is the same
    solution; the plain examples stay as they were."""
    from transformers import AutoTokenizer

    from distill.domains import build_domain
    from distill.zoo.build import supervised_examples

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    domain = build_domain(tiny_zoo.domain)
    items = [i for i in domain.train_items() if i.solution][:40]
    plain = supervised_examples(tok, domain, items)
    both = supervised_examples(tok, domain, items, privileged_share=0.5, seed=1)
    assert both[: len(plain)] == plain and 10 <= len(both) - len(plain) <= 30
    for ids, labels in both[len(plain) :]:
        prompt = _prompt_text(tok, ids, labels)
        target = tok.decode([y for y in labels if y != -100], skip_special_tokens=True)
        assert "=== Reference Solution Begin ===" in prompt and target.strip() in prompt
    # With a pool, the privileged views are of the pool's items (here none of the plain ones).
    pool = [i for i in domain.train_items() if i.solution][40:70]
    pooled = supervised_examples(tok, domain, items, privileged_share=1.0, privileged_pool=pool)
    assert pooled[: len(plain)] == plain and len(pooled) == len(plain) + len(pool)
    for item, (ids, labels) in zip(pool, pooled[len(plain) :], strict=True):
        prompt = _prompt_text(tok, ids, labels)
        assert "=== Reference Solution Begin ===" in prompt and item.solution.strip() in prompt


def test_privileged_items_widen_the_privileged_view_beyond_the_students_slice(tiny_zoo: Any) -> None:
    """`privileged_items` (zoo:student-privileged): the plain view stays on the first
    `data_items` items, the privileged view covers the first `privileged_items`."""
    from transformers import AutoTokenizer

    from distill.domains import build_domain
    from distill.zoo.build import _solution_examples
    from distill.zoo.recipes import student_shape

    tok = AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)
    domain = build_domain(tiny_zoo.domain)
    items = domain.train_items()
    recipe = student_shape(steps=1, lr=1e-3, batch_size=1, data_items=6, privileged_share=1.0)
    same = _solution_examples(domain, "s", recipe, tok)
    wide = _solution_examples(domain, "s", recipe.model_copy(update={"privileged_items": 20}), tok)
    assert len(same) == 6 + 6 and len(wide) == 6 + 20 and wide[:6] == same[:6]
    for item, (ids, labels) in zip(items[:20], wide[6:], strict=True):
        prompt = _prompt_text(tok, ids, labels)
        assert "=== Reference Solution Begin ===" in prompt and item.solution.strip() in prompt


def test_a_users_problems_train_with_the_domains_own_zoo(tmp_path: Path) -> None:
    # Plain problem/answer rows, no worked solutions: what a user's data usually is.
    from distill.domains.dapo.config import DapoDomainConfig
    from distill.domains.mixed.config import MixConfig

    data = tmp_path / "mine.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"What is {n} + {n}?", "answer": 2 * n}) + "\n" for n in range(40))
    )
    own = DapoDomainConfig(train_size=128, eval_size=8)
    user = own.model_copy(update={"data": str(data)})
    for name in ("tok-qwen", "student"):
        assert entry_dir(tmp_path, name, user, TINY_RECIPES) == entry_dir(tmp_path, name, own, TINY_RECIPES)
    built = ensure_built(tmp_path / "zoo", "student", user, show_progress=False, recipes=TINY_RECIPES)
    assert built == entry_dir(tmp_path / "zoo", "student", own, TINY_RECIPES)
    entry = read_entry(built)
    assert entry is not None and entry.eval["items"] == 8.0  # the domain's own eval items
    # A mix holding the user's dapo data: its dapo part's zoo is the domain's own too.
    mix = MixConfig(name="rlve+dapo", parts={"rlve": tiny_domain(), "dapo": user})
    plain = MixConfig(name="rlve+dapo", parts={"rlve": tiny_domain(), "dapo": own})
    assert recipe_key("teacher@dapo", mix, TINY_RECIPES) == recipe_key("teacher@dapo", plain, TINY_RECIPES)
