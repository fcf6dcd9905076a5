"""Which chat template a model renders with: its tokenizer's own, the file the user names, or none.

A tokenizer without a chat template (GPT-2 and many base models) used to fail deep inside the
first render, or worse, could be given some library default that the model never saw. Here it is
refused in one line naming the model and the fix, unless the user names a Jinja file
(`student.chat_template=<file>` / `teacher.chat_template=<file>`), which then replaces the
tokenizer's own. The file is checked where the config is (zoo/check.py, before a run directory exists: it
must exist and parse) and read again where the engine's tokenizer is loaded, which applies it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TemplateError(ValueError):
    """A missing or unusable chat template (a one-line, user-facing error)."""


def read_template(path: str, label: str) -> str:
    """The Jinja text of a template file, parsed once so a broken file fails here in one line
    (`label`: the setting that named it, e.g. `teacher.chat_template`)."""
    import jinja2

    file = Path(path).expanduser()
    if not file.is_file():
        raise TemplateError(f"{label}: no such file {file}")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"{label}: cannot read {file}: {type(exc).__name__}") from None
    if not text.strip():
        raise TemplateError(f"{label}: {file} is empty")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{label}: {file} is not a Jinja template: line {exc.lineno}: {exc.message}"
        ) from None
    return text


def missing_template(model: str, role: str) -> str:
    """The one line that refuses a model whose tokenizer has no chat template. `role`: "student" /
    "teacher" (a run: the setting names the fix), or an option such as `--model` (an eval)."""
    why = f"{model} has no chat template (none in its tokenizer_config.json, no chat_template.jinja)"
    if role.startswith("-"):
        return f"{role}: {why}; write the template the model was trained with to chat_template.jinja in its folder"
    return f"{role}.name: {why}; name one with {role}.chat_template=<file.jinja>"


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase, template_file: str | None, model: str, role: str
) -> None:
    """Give `tokenizer` the template named by `template_file` (replacing its own), or check it
    has one; TemplateError otherwise. `role`: "student" or "teacher", for the setting's name."""
    if template_file is not None:
        tokenizer.chat_template = read_template(template_file, f"{role}.chat_template")
        return
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(missing_template(model, role))
