"""Fixtures: a per-test workspace and `make_run`, which writes a run directory into it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .fake_runs import write_run

MakeRun = Callable[..., Path]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ws = tmp_path / "ws"
    (ws / "runs").mkdir(parents=True)
    monkeypatch.setenv("DISTILL_WORKSPACE", str(ws))
    return ws


@pytest.fixture
def make_run(workspace: Path) -> MakeRun:
    return lambda name, **kw: write_run(workspace, name, **kw)
