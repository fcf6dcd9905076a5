"""Session fixtures: tiny models built from config with locally trained tokenizers (no hub)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A researcher's own settings must not send the tests to their zoo, tracking store or DVC remote
# (an inherited DISTILL_ZOO_DIR made the DVC pipeline's zoo stage write outside its project); the
# workspace is set per session below, and each test that needs one of these sets its own.
for _setting in ("DISTILL_ZOO_DIR", "DISTILL_TRACKING_URI", "DISTILL_REMOTE"):
    os.environ.pop(_setting, None)

# `import dvc` installs dvc's log handlers on the streams of that moment: here, the session's, not
# those of a test that imported it first inside a captured stream closed after it (CliRunner).
import dvc  # noqa: E402, F401

from distill.config import DomainBase  # noqa: E402
from distill.domains.rlve.config import RLVEDomainConfig  # noqa: E402
from distill.zoo.recipes import ModelRecipe, TokenizerRecipe  # noqa: E402

# Small enough to build in seconds; the default recipes are exercised by the README command.
# 4096 positions: a SciWorld episode in these 400-token vocabularies runs past 1024 by turn 2.
TINY_RECIPES = {
    "tok-qwen": TokenizerRecipe(family="qwen", vocab_size=400),
    "tok-llama": TokenizerRecipe(family="llama", vocab_size=450),
    "teacher": ModelRecipe(
        arch="qwen3",
        tokenizer="tok-qwen",
        hidden=64,
        layers=1,
        heads=2,
        kv_heads=1,
        intermediate=128,
        steps=60,
        lr=3e-3,
        batch_size=16,
        warmup_steps=5,
        max_positions=4096,
    ),
    # The other tokenizer family: the cross-family pair with "student".
    "teacher-llama": ModelRecipe(
        arch="llama",
        tokenizer="tok-llama",
        hidden=64,
        layers=1,
        heads=2,
        kv_heads=1,
        intermediate=128,
        steps=60,
        lr=3e-3,
        batch_size=16,
        warmup_steps=5,
        max_positions=4096,
    ),
    "student": ModelRecipe(
        arch="qwen3",
        tokenizer="tok-qwen",
        hidden=32,
        layers=1,
        heads=1,
        kv_heads=1,
        intermediate=64,
        steps=20,
        lr=3e-3,
        batch_size=16,
        data_items=64,
        warmup_steps=5,
        max_positions=4096,
    ),
}


def tiny_domain() -> DomainBase:
    return RLVEDomainConfig(train_size=256, eval_size=16)


@pytest.fixture(scope="session", autouse=True)
def _workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Materialised domain data and anything else written to the workspace stays in a temp dir."""
    ws = tmp_path_factory.mktemp("workspace")
    os.environ["DISTILL_WORKSPACE"] = str(ws)
    return ws


@dataclass(frozen=True)
class TinyZoo:
    root: Path
    domain: DomainBase
    teacher: Path
    student: Path
    tok_qwen: Path
    tok_llama: Path
    teacher_llama: Path


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory: pytest.TempPathFactory, _workspace: Path) -> TinyZoo:
    from distill.zoo.build import ensure_built

    root = tmp_path_factory.mktemp("zoo")
    domain = tiny_domain()

    def build(name: str) -> Path:
        return ensure_built(root, name, domain, show_progress=False, recipes=TINY_RECIPES)

    return TinyZoo(
        root=root,
        domain=domain,
        teacher=build("teacher"),
        student=build("student"),
        tok_qwen=build("tok-qwen"),
        tok_llama=build("tok-llama"),
        teacher_llama=build("teacher-llama"),
    )


@dataclass(frozen=True)
class RealShape:
    """Qwen's real vocabulary (151,936 rows) and Qwen3's real template at tiny width, random weights."""

    root: Path
    tokenizer: Path
    student: Path
    teacher: Path


@pytest.fixture(scope="session")
def real_shape(tmp_path_factory: pytest.TempPathFactory, _workspace: Path) -> RealShape:
    from distill.zoo.build import ensure_built
    from distill.zoo.recipes import RECIPES

    root = tmp_path_factory.mktemp("zoo-qwen3")
    domain = tiny_domain()

    def build(name: str) -> Path:
        return ensure_built(root, name, domain, show_progress=False, recipes=RECIPES)

    return RealShape(root, build("tok-qwen3"), build("student-qwen3"), build("teacher-qwen3"))


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text game (tests/episodes/textgame.py) as a domain: the one line a new domain adds to
    distill/registry.py."""
    from episodes.textgame import ENTRY, NAME

    from distill import registry

    monkeypatch.setitem(registry.DOMAINS, NAME, ENTRY)
