"""The run lock against real processes: a live holder refuses a second writer, a dead one's lock
(SIGKILL, or a forked child that outlived it) is taken over, `live_status` follows the lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distill.tracking.lock import RunLock, lock_held, read_holder
from distill.tracking.rundir import RunDir, RunRefused, live_status

# A process that takes the run's lock, says so, and keeps it until it is killed. With "fork" it
# first forks a child that inherits the lock and sleeps on after its parent is gone.
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from distill.tracking.lock import RunLock
    from distill.tracking.rundir import RunDir
    lock = RunLock.acquire(RunDir(sys.argv[1]))
    child = os.fork() if sys.argv[2] == "fork" else None
    if child == 0:
        time.sleep(120)
        os._exit(0)
    print(os.getpid(), child or "", flush=True)
    time.sleep(120)
    """
)


def _hold(run: RunDir, mode: str = "plain") -> tuple[subprocess.Popen[str], int | None]:
    """The holder process and, with "fork", its child's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run.path), mode], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    words = proc.stdout.readline().split()  # printed once the lock is held
    assert words and words[0] == str(proc.pid), words
    return proc, (int(words[1]) if len(words) > 1 else None)


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "runs" / "r1")
    run.path.mkdir(parents=True)
    return run


def test_a_live_writer_refuses_a_second_and_a_killed_ones_lock_is_taken_over(run: RunDir) -> None:
    proc, _ = _hold(run)
    try:
        with pytest.raises(RunRefused) as refused:
            RunLock.acquire(run)
        message = str(refused.value)
        assert f"pid {proc.pid}" in message and "\n" not in message and run.name in message
        assert lock_held(run) is True
        summary = {"status": "RUNNING", "pid": proc.pid, "run_dir": str(run.path)}
        assert live_status(summary) == "RUNNING"
    finally:
        _kill(proc)
    # SIGKILL left the file (and the dead pid in it) behind; the kernel dropped the lock itself.
    assert run.lock.exists() and read_holder(run)["pid"] == proc.pid
    assert lock_held(run) is False
    assert live_status(summary) == "DIED"
    with RunLock.acquire(run):
        assert read_holder(run)["pid"] == os.getpid()
        assert lock_held(run) is True  # a second open in the holding process conflicts too
        with pytest.raises(RunRefused):
            RunLock.acquire(run)
    assert not run.lock.exists()  # released: gone, and the run reads as the summary says
    assert live_status({"status": "FINISHED", "run_dir": str(run.path)}) == "FINISHED"


def test_a_lock_kept_by_a_forked_child_of_a_dead_writer_is_taken_over(run: RunDir) -> None:
    proc, child = _hold(run, "fork")
    assert child is not None
    _kill(proc)
    try:
        os.kill(child, 0)  # the child lives on, holding the inherited flock
        # The recorded writer is gone: the run is not being written, whatever the child holds.
        assert lock_held(run) is False
        with RunLock.acquire(run):
            assert read_holder(run)["pid"] == os.getpid()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_recorded_holder_on_another_host_is_taken_to_be_alive(run: RunDir) -> None:
    # A file system without flock falls back on the record: a holder elsewhere cannot be checked.
    from distill.tracking.lock import _holder_alive

    run.lock.write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "started": "t"}))
    assert _holder_alive(run, busy=False) is True
    run.lock.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    assert _holder_alive(run, busy=False) is False
    run.lock.write_text("")  # a holder between taking the flock and writing its name
    assert _holder_alive(run, busy=True) is True


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    return proc.pid
