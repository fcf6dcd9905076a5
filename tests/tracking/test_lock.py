"""The run lock against real processes: a live holder refuses a second writer, a dead one's lock
(SIGKILL, or a forked child that outlived it) is taken over, `live_status` follows the lock, three
writers racing on every stage a lock can be found in never both hold it, with or without flock."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distill.tracking import lock as lock_module
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


def _record(run: RunDir, **fields: object) -> None:
    run.lock.write_text(json.dumps({"started": "t", **fields}))


def test_release_never_removes_another_writers_lock(run: RunDir) -> None:
    first = RunLock.acquire(run)
    # The file is replaced under it (as when its writer was taken to be gone) and a second writer
    # takes the new one: giving back the first must leave the second's lock where it is.
    os.unlink(run.lock)
    second = RunLock.acquire(run)
    first.release()
    assert run.lock.exists() and read_holder(run)["token"] == second.token
    assert lock_held(run) is True
    second.release()
    assert not run.lock.exists()


def _race_round(run_path: str, rounds: int, gate, results, no_flock: bool) -> None:  # type: ignore[no-untyped-def]
    """One of three writers (a forked process): each round, once the test set the stage, try to
    take the lock; hold it until all three have tried; say whether it got it."""
    import fcntl as fcntl_module

    real_truncate, real_flock = os.ftruncate, fcntl_module.flock

    def slow_truncate(fd: int, length: int) -> None:
        time.sleep(0.03)  # widen the moment between taking the lock and writing the record
        real_truncate(fd, length)

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    os.ftruncate = slow_truncate
    if no_flock:
        fcntl_module.flock = no_flock
    try:
        for r in range(rounds):
            gate.wait()  # the test set the stage
            lock = RunLock.try_acquire(RunDir(Path(run_path)))
            results.put((r, os.getpid(), lock is not None))
            gate.wait()  # every writer has tried: a holder still holds
            if lock is not None:
                lock.release()
            gate.wait()
    finally:
        os.ftruncate, fcntl_module.flock = real_truncate, real_flock


def _orphan(run: RunDir, dead: int):  # type: ignore[no-untyped-def]
    """A process holding the lock's flock under a dead writer's record (a forked child of it)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()

    def hold() -> None:
        import fcntl as fcntl_module

        fd = os.open(run.lock, os.O_RDWR | os.O_CREAT)
        fcntl_module.flock(fd, fcntl_module.LOCK_EX)
        os.write(fd, json.dumps({"pid": dead, "host": socket.gethostname(), "started": "t"}).encode())
        ready.set()
        time.sleep(120)

    proc = ctx.Process(target=hold, daemon=True)
    proc.start()
    assert ready.wait(30)
    return proc


STAGES = {
    "flock": ("stale", "none", "orphan"),
    "no_flock": ("stale", "none", "elsewhere-silent"),
}


@pytest.mark.parametrize("mode", list(STAGES))
def test_three_writers_race_and_one_writes(run: RunDir, mode: str) -> None:
    """Three writers start at once, again and again, on every stage a run's lock can be found in
    (a SIGKILLed writer's record, no file, a lock kept by an orphaned child, a holder on another
    host gone silent), with the record's write slowed: exactly one of them holds the lock each
    round."""
    ctx = multiprocessing.get_context("fork")
    per_stage, stages = 6, STAGES[mode]
    rounds = per_stage * len(stages)
    gate, results = ctx.Barrier(4), ctx.Queue()
    writers = [
        ctx.Process(target=_race_round, args=(str(run.path), rounds, gate, results, mode == "no_flock"))
        for _ in range(3)
    ]
    for w in writers:
        w.start()
    dead, orphan = _dead_pid(), None
    got: dict[int, list[int]] = {}
    try:
        for r in range(rounds):
            stage = stages[r % len(stages)]
            with contextlib.suppress(FileNotFoundError):
                run.lock.unlink()
            if stage == "stale":
                _record(run, pid=dead, host=socket.gethostname())
            elif stage == "orphan":
                orphan = _orphan(run, dead)
            elif stage == "elsewhere-silent":
                _record(run, pid=1, host="elsewhere.example")
                old = time.time() - lock_module.STALE_S - 5
                os.utime(run.lock, (old, old))
            gate.wait(timeout=60)
            gate.wait(timeout=60)
            for _ in range(3):
                rnd, pid, held = results.get(timeout=60)
                if held:
                    got.setdefault(rnd, []).append(pid)
            gate.wait(timeout=60)
            if orphan is not None:
                orphan.kill()
                orphan.join()
                orphan = None
            assert len(got.get(r, [])) == 1, f"round {r} ({stage}): holders {got.get(r)}"
    finally:
        gate.abort()  # a failed round releases the writers waiting at the gate
        for w in writers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
        if orphan is not None:
            orphan.kill()


def test_without_flock_another_hosts_lock_lives_while_touched(
    run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without flock: a holder elsewhere is alive while it keeps touching its file
    (its heartbeat), and taken to be gone once silent for STALE_S; this host's by its pid."""
    import fcntl as fcntl_module

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl_module, "flock", no_flock)
    monkeypatch.setattr(lock_module, "HEARTBEAT_S", 0.05)
    _record(run, pid=1, host="elsewhere.example")
    assert lock_held(run) is True
    with pytest.raises(RunRefused, match="on elsewhere.example"):
        RunLock.acquire(run)
    old = time.time() - lock_module.STALE_S - 5
    os.utime(run.lock, (old, old))
    assert lock_held(run) is False
    with RunLock.acquire(run) as lock:
        assert read_holder(run)["token"] == lock.token
        before = run.lock.stat().st_mtime
        os.utime(run.lock, (old, old))
        time.sleep(0.3)
        assert run.lock.stat().st_mtime > old + 60  # the heartbeat touched it again
        assert before > old and lock_held(run) is True
        with pytest.raises(RunRefused):
            RunLock.acquire(run)
    assert not run.lock.exists()
    _record(run, pid=_dead_pid(), host=socket.gethostname())
    assert lock_held(run) is False  # this host's holder is gone


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    return proc.pid
