"""What a zoo build says before it starts, and what a killed build leaves for the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_RECIPES

from distill.config import domain_config
from distill.domains.rlve.config import RLVEDomainConfig
from distill.zoo.build import _DATA_FIELDS, ensure_built
from distill.zoo.notices import (
    TYPICAL_SECONDS,
    build_notice,
    changed_data_fields,
    remove_stale_builds,
    typical_seconds,
)
from distill.zoo.recipes import TokenizerRecipe, ZooEntry


def test_a_data_override_is_named_before_its_build(tmp_path: Path) -> None:
    default = domain_config("rlve")
    assert changed_data_fields(default, _DATA_FIELDS) == []
    mine = domain_config("rlve", environments=["Division"], eval_seed=7)
    assert changed_data_fields(mine, _DATA_FIELDS) == [
        "domain.environments=['Division']",
        "domain.eval_seed=7",
    ]
    line = build_notice(tmp_path, "student", mine, tmp_path / "rlve" / "student-abc", _DATA_FIELDS)
    assert "\n" not in line
    assert (
        "building a new student for rlve data with domain.environments=['Division'] domain.eval_seed=7"
        in line
    )
    assert "the default student is not reused" in line and str(tmp_path / "rlve") in line
    # Nothing built here yet: the measured figure.
    assert f"typically {TYPICAL_SECONDS['rlve']['student']} s" in line
    plain = build_notice(tmp_path, "student", default, tmp_path / "rlve" / "student-abc", _DATA_FIELDS)
    assert "first use" in plain and "not reused" not in plain


def test_typical_seconds_come_from_this_zoo(tmp_path: Path) -> None:
    for i, seconds in enumerate((30.0, 50.0, 70.0)):
        entry = tmp_path / "rlve" / f"student-{i}"
        entry.mkdir(parents=True)
        meta = ZooEntry(name="student", domain="rlve", key=str(i), recipe={}, seconds=seconds)
        (entry / "zoo.json").write_text(meta.model_dump_json())
    assert typical_seconds(tmp_path, "student", "rlve") == 50.0
    # No dapo student measured: another domain's builds.
    assert typical_seconds(tmp_path, "student", "dapo") == 50.0
    # None built: the table.
    assert typical_seconds(tmp_path, "teacher", "rlve") == TYPICAL_SECONDS["rlve"]["teacher"]
    # A sciworld student takes three times an rlve one: its own measured figure before rlve's builds.
    assert typical_seconds(tmp_path, "student", "sciworld") == TYPICAL_SECONDS["sciworld"]["student"] == 129


def test_the_notice_is_printed_before_a_build(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    recipes = {"tok": TokenizerRecipe(family="llama", vocab_size=300)}
    domain = RLVEDomainConfig(train_size=8, eval_size=4)
    ensure_built(tmp_path, "tok", domain, show_progress=True, recipes=recipes)
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith(
        "zoo: building a new tok for rlve data with domain.eval_size=4 domain.train_size=8"
    )
    assert err[-1].startswith("zoo: built tok in")
    leftovers = [
        p.name for p in (tmp_path / "rlve").iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")
    ]
    assert leftovers == []


def test_stale_tmp_of_a_dead_process_is_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    target = tmp_path / "student-abc"
    stale = tmp_path / f"student-abc.tmp-{pid}"
    live = tmp_path / f"student-abc.tmp-{os.getppid()}"  # a live process: maybe building, kept
    other = tmp_path / f"teacher-abc.tmp-{pid}"  # another entry: its own build cleans it
    for folder in (stale, live, other):
        folder.mkdir()
    assert remove_stale_builds(target) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


@pytest.mark.integration
def test_a_build_killed_mid_way_is_cleaned_and_rebuilt(tmp_path: Path) -> None:
    """SIGKILL during a real build leaves `<entry>.tmp-<pid>` and its lock; the next build of the
    entry removes both and succeeds."""
    tests = Path(__file__).resolve().parents[1]
    script = (
        "import sys; from pathlib import Path\n"
        f"sys.path.insert(0, {str(tests)!r})\n"
        "from conftest import TINY_RECIPES\n"
        "from distill.domains.rlve.config import RLVEDomainConfig\n"
        "from distill.zoo.build import ensure_built\n"
        f"ensure_built(Path({str(tmp_path)!r}), 'student', RLVEDomainConfig(train_size=64, eval_size=8),"
        " show_progress=False, recipes=TINY_RECIPES)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTILL_WORKSPACE": str(tmp_path / "ws")}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    folder = tmp_path / "rlve"
    deadline = time.monotonic() + 240
    try:
        while not list(folder.glob("student-*.tmp-*")):
            assert proc.poll() is None, "the build ended before it could be killed"
            assert time.monotonic() < deadline, "the student build never started"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    left = sorted(p.name for p in folder.iterdir())
    assert any(".tmp-" in name for name in left) and any(name.endswith(".lock") for name in left), left

    domain = RLVEDomainConfig(train_size=64, eval_size=8)
    path = ensure_built(tmp_path, "student", domain, show_progress=False, recipes=TINY_RECIPES)
    assert (path / "zoo.json").exists()
    after = sorted(p.name for p in folder.iterdir())
    assert not [name for name in after if ".tmp-" in name or name.endswith(".lock")], after
