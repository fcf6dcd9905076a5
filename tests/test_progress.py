"""Progress off a terminal (a log file, CI, nohup): plain lines, so long work never looks hung."""

from __future__ import annotations

import pytest

from distill import progress
from distill.progress import progress_bar


def test_lines_at_each_tenth_and_at_the_end(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    with progress_bar("zoo: training teacher (rlve)", total=40) as advance:
        for _ in range(40):
            advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("zoo: training teacher (rlve): 4/40 (10%), ")
    assert lines[-1].startswith("zoo: training teacher (rlve): 40/40 (100%), ")
    assert len(lines) == 10  # 10%..90%, then the end


def test_a_slow_tenth_still_reports(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "QUIET_S", 0.0)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)  # every advance is "long enough ago"
    with progress_bar("eval", total=1000) as advance:
        advance(1)
        advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["eval: 1/1000 (0%), 0 s", "eval: 2/1000 (0%), 0 s"]


def test_short_disabled_and_untouched_bars_say_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar("a short eval", total=200) as advance:
        for _ in range(4):
            advance(50)  # done well within QUIET_S
    with progress_bar("quiet", total=5, enabled=False) as advance:
        advance(5)
    with progress_bar("empty", total=0):
        pass
    assert capsys.readouterr().err == ""
