"""The family matrix's pairs, built once per session from real tokenizers (distill/zoo/families.py).

Every model is random at width 32 with one layer; rows as the real releases have them. Qwen3's
tokenizer is the `real_shape` fixture's (tests/conftest.py), so the suite converts Qwen's BPE once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# A template a GPT-2 user would write: its one special token ends each assistant turn.
GPT2_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\\n\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ 'Assistant: ' + m['content'] + eos_token + '\\n\\n' }}"
    "{% else %}{{ m['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# (model, tokenizer family, shape fields): the models the cells name.
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "s-qwen3": ("qwen3", {"rows": 151_936, "arch": "qwen3"}),
    "t-qwen3": ("qwen3", {"rows": 151_936, "arch": "qwen3", "seed": 1}),
    "s-qwen25": ("qwen25", {"rows": 151_936, "arch": "qwen3"}),  # Qwen2.5 up to 3B
    "t-qwen25": ("qwen25", {"rows": 152_064, "arch": "qwen3", "seed": 1}),  # Qwen2.5 from 7B
    "s-qwen15": ("qwen15", {"rows": 151_646, "arch": "qwen3"}),  # resized to its tokenizer
    "t-qwen15": ("qwen15", {"rows": 151_936, "arch": "qwen3", "seed": 1}),
    "t-qwen3-thinking": ("qwen3-thinking", {"rows": 151_936, "arch": "qwen3", "seed": 1}),
    "t-gpt2": ("gpt2", {"rows": 50_257, "seed": 1}),
    "t-llama3": ("llama3", {"rows": 50_512, "seed": 1}),
    "t-mistral": ("mistral", {"rows": 32_000, "seed": 1}),
}


@dataclass(frozen=True)
class Families:
    root: Path
    tokenizers: dict[str, Path]
    models: dict[str, Path]
    gpt2_template: Path  # GPT2_TEMPLATE as a file (`teacher.chat_template=<file>`)

    def __getitem__(self, name: str) -> str:
        return str(self.models[name])


def _gap_heavy(path: Path) -> None:
    """Scale the embedding rows past the tokenizer (151,669..151,935) up: at temperature 1 the
    random student then samples an id in the gap in nearly every rollout, as the issue's crash needs
    (with plain random weights it is one token in ~570)."""
    import torch
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    weights = load_file(str(file))
    key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    with torch.no_grad():
        weights[key][151_669:] *= 60.0
    save_file(weights, str(file), metadata={"format": "pt"})


@pytest.fixture(scope="session")
def families(real_shape: Any, tmp_path_factory: pytest.TempPathFactory) -> Families:
    from distill.zoo import families as fam

    root = tmp_path_factory.mktemp("families")
    toks = {"qwen3": Path(real_shape.tokenizer)}
    for name in ("qwen25", "qwen15", "qwen3-thinking", "gpt2", "llama3", "mistral"):
        toks[name] = root / f"tok-{name}"
        fam.build_tokenizer(name, toks[name], qwen3_dir=toks["qwen3"])
    models = {
        name: fam.build_model(toks[family], root / name, fam.Shape(**shape))
        for name, (family, shape) in MODELS.items()
    }
    # GPT-2 with the template its user wrote into the folder (the run path that works today).
    models["t-gpt2-chat"] = fam.build_model(
        toks["gpt2"], root / "t-gpt2-chat", fam.Shape(50_257, seed=1), GPT2_TEMPLATE
    )
    models["s-qwen3-gap"] = fam.build_model(toks["qwen3"], root / "s-qwen3-gap", fam.Shape(151_936, "qwen3"))
    _gap_heavy(models["s-qwen3-gap"])
    template = root / "gpt2-chat.jinja"
    template.write_text(GPT2_TEMPLATE)
    return Families(root, toks, models, template)


def run_cli(args: list[str], workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from typer.testing import CliRunner

    from distill.cli.app import app

    monkeypatch.setenv("DISTILL_WORKSPACE", str(workspace))
    return CliRunner().invoke(app, args)


# One short step of each method: 2 prompts x 2 samples of 8 tokens, one eval item of 2 tokens.
SHORT = [
    "optim.max_steps=1",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=8",
    "rollout.temperature=1.0",
    "eval.items=1",
    "eval.max_new_tokens=2",
    "eval.eval_teacher=false",
    "checkpoint.every_steps=0",
]
METHOD_ARGS = {
    "rose": ["method.prefix_tokens=4", "method.teacher_max_tokens=4"],
    "sft": ["method.keep_verified_only=false"],
}


def train_steps(workspace: Path, run: str) -> list[dict[str, Any]]:
    """The step records a finished run logged (metrics.jsonl lines with a train/loss)."""
    folder = workspace / "runs" / run
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "FINISHED", summary
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if '"train/loss"' in line]
