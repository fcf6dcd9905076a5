"""distill.zoo.check: a model name is checked in a blink, on its own terms (zoo, folder, hub id)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from distill.config import ConfigError, resolve_config
from distill.zoo.check import check_model_name, check_models, is_path_like


def test_path_like_names() -> None:
    assert is_path_like("/models/x") and is_path_like("./x") and is_path_like("~/x") and is_path_like("a/b/c")
    assert not is_path_like("Qwen/Qwen3-1.7B") and not is_path_like("gpt2")


def test_folders(tiny_zoo: Any, tmp_path: Path) -> None:
    check_model_name(str(tiny_zoo.student), "rlve", "student.name")  # a built model: fine
    check_model_name(str(tiny_zoo.tok_qwen), "rlve", "teacher.name", tokenizer_only=True)
    cases = {
        str(tmp_path / "gone"): "no such folder",
        str(tiny_zoo.tok_qwen): "it has no config.json",  # a tokenizer is not a model
    }
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    shutil.copy(tiny_zoo.student / "config.json", no_tok / "config.json")
    cases[str(no_tok)] = "it has no tokenizer"
    (tmp_path / "weights.bin").write_text("x")
    cases[str(tmp_path / "weights.bin")] = "is a file, not a model folder"
    for name, needle in cases.items():
        with pytest.raises(ConfigError, match=needle) as info:
            check_model_name(name, "rlve", "student.name")
        assert str(info.value).startswith(f"student.name: {name}" if "gone" not in name else "student.name:")
    with pytest.raises(ConfigError, match="not a tokenizer folder"):
        check_model_name(str(no_tok), "rlve", "--teacher", tokenizer_only=True)


def test_zoo_names_are_checked_against_the_domain_recipes() -> None:
    check_model_name("zoo:student", "rlve", "student.name")
    check_model_name("zoo:teacher", "sciworld", "teacher.name")
    with pytest.raises(
        ConfigError, match=r"teacher.name: unknown zoo model 'zoo:nope'; known: .*zoo:teacher"
    ):
        check_model_name("zoo:nope", "rlve", "teacher.name")
    # OPSD's privileged-prompt student exists for every domain (SciWorld: the gold plan's view).
    check_model_name("zoo:student-privileged", "dapo", "student.name")
    check_model_name("zoo:student-privileged", "sciworld", "student.name")


def test_hub_ids_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE"):
        check_model_name("distill-test/tiny", "rlve", "student.name")
    with pytest.raises(ConfigError, match="neither a local folder nor a Hugging Face model id"):
        check_model_name("not a hub id!", "rlve", "student.name")
    # A model in the cache (the layout huggingface_hub writes) passes without the network.
    repo = tmp_path / "models--distill-test--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    check_model_name("distill-test/tiny", "rlve", "student.name")


def test_check_models_names_the_role(tmp_path: Path) -> None:
    cfg = resolve_config("rlve", "opd", overrides=[f"teacher.name={tmp_path / 'gone'}"])
    with pytest.raises(ConfigError, match=r"^teacher.name: no such folder"):
        check_models(cfg)
    opsd = resolve_config("rlve", "opsd", overrides=[f"student.name={tmp_path / 'gone'}"])
    with pytest.raises(ConfigError, match=r"^student.name:"):  # one model, named once
        check_models(opsd)
