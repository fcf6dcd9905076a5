"""A method's RunContext on the text game, with real engines: what the episode-method tests train
or score through, without a runner around them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .textgame import TextGame, TextGameConfig


def textgame_context(
    run_dir: Path, domain: TextGameConfig, config: Any, student: Any, teacher: Any, resume: Path | None = None
) -> Any:
    """`config` (a RunConfig) on `domain`, the engines loaded from the `student` and `teacher` paths."""
    from distill.engines.hf import HFEngine
    from distill.methods.context import RunContext
    from distill.tracking.base import NullTracker
    from distill.tracking.rundir import RunDir
    from distill.tracking.steplog import StepLog

    run_dir.mkdir(exist_ok=True)
    return RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=TextGame(domain),
        student=HFEngine.load(str(student)),
        teacher=HFEngine.load(str(teacher)),
        log=StepLog(RunDir(run_dir), NullTracker()),
        resume_from=resume,
    )
