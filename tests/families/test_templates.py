"""A tokenizer without a chat template: refused in one line naming the model and the fix, or given
the template file the user names; a bad file is refused at config time (zoo/check.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distill.config import ConfigError, ModelConfig
from distill.engines.templates import TemplateError, apply_chat_template, read_template
from distill.zoo.check import check_template, folder_has_template

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distill.zoo.families import gpt2_tokenizer

    out = tmp_path_factory.mktemp("gpt2")
    gpt2_tokenizer(out)
    (out / "config.json").write_text("{}")  # a model folder as far as the name check goes
    return out


def test_gpt2_ships_without_a_template(gpt2_dir: Path) -> None:
    config = json.loads((gpt2_dir / "tokenizer_config.json").read_text())
    assert not config.get("chat_template") and not folder_has_template(gpt2_dir)


def test_no_template_is_refused_naming_model_and_fix(gpt2_dir: Path) -> None:
    with pytest.raises(ConfigError) as err:
        check_template(ModelConfig(name=str(gpt2_dir)), "teacher")
    message = str(err.value)
    assert message.startswith(f"teacher.name: {gpt2_dir} has no chat template")
    assert "teacher.chat_template=<file.jinja>" in message and "\n" not in message


def test_a_named_file_is_checked_at_config_time(gpt2_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jinja"
    with pytest.raises(ConfigError, match=rf"^student.chat_template: no such file {missing}$"):
        check_template(ModelConfig(name=str(gpt2_dir), chat_template=str(missing)), "student")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}")  # the loop never ends
    with pytest.raises(
        ConfigError, match=r"^teacher.chat_template: .*broken.jinja is not a Jinja template: line 1"
    ):
        check_template(ModelConfig(name=str(gpt2_dir), chat_template=str(broken)), "teacher")
    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        check_template(ModelConfig(name=str(gpt2_dir), chat_template=str(empty)), "teacher")
    good = tmp_path / "chatml.jinja"
    good.write_text(CHATML)
    check_template(ModelConfig(name=str(gpt2_dir), chat_template=str(good)), "teacher")


def test_a_folder_with_a_template_file_passes(gpt2_dir: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "with-jinja"
    shutil.copytree(gpt2_dir, folder)
    (folder / "chat_template.jinja").write_text(CHATML)
    assert folder_has_template(folder)
    check_template(ModelConfig(name=str(folder)), "student")
    check_template(ModelConfig(name="zoo:student"), "student")  # zoo tokenizers carry theirs


def test_apply_gives_the_named_template_or_refuses(gpt2_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from distill.engines.base import render_chat

    tok: Any = AutoTokenizer.from_pretrained(gpt2_dir)
    with pytest.raises(TemplateError, match=r"^teacher.name: gpt2 has no chat template"):
        apply_chat_template(tok, None, "gpt2", "teacher")
    file = tmp_path / "chatml.jinja"
    file.write_text(CHATML)
    apply_chat_template(tok, str(file), "gpt2", "teacher")
    assert render_chat(tok, "hi") == "<|im_start|>user\nhi<|endoftext|>\n<|im_start|>assistant\n"
    apply_chat_template(tok, None, "gpt2", "teacher")  # it has one now: nothing to say
    assert read_template(str(file), "x") == CHATML
    with pytest.raises(TemplateError, match=r"^--model: gpt2 has no chat template.*chat_template.jinja"):
        tok.chat_template = None
        apply_chat_template(tok, None, "gpt2", "--model")
