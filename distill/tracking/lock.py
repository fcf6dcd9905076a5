"""One writer per run directory: `run.lock`, held for as long as a process writes the run.

The lock is an `flock` on `<run>/run.lock`, so the kernel drops it the moment its process dies, by
SIGKILL included: a stale lock is simply one nobody holds, and the next writer takes it over. The
file also records who holds it (pid, host, start time) for the refusal message. Where the file
system has no `flock` (some network and FUSE mounts) the recorded pid is checked instead, on the
same host. `flock` locks belong to one open file: a second `open` in the holding process
conflicts too, so a process cannot take its own run twice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol


class RunRefused(ValueError):
    """A run that cannot be created, found or written as asked: one line for the user (CLI exit 2),
    raised before anything is written."""


class RunDir(Protocol):
    """What the lock needs of a run folder (tracking/rundir.py's RunDir)."""

    @property
    def name(self) -> str: ...

    @property
    def lock(self) -> Path: ...


# A probe (`lock_held`, from `distill runs`) holds the lock for microseconds: a writer that meets
# one retries briefly before refusing.
ATTEMPTS = 4
RETRY_S = 0.05


def _holder_info() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def read_holder(run: RunDir) -> dict[str, Any]:
    """Who holds (or last held) the run's lock, as recorded in the file; {} when unreadable."""
    try:
        data = json.loads(run.lock.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_alive(holder: dict[str, Any]) -> bool:
    """Whether the recorded holder may still run: its pid exists on this host (a process on
    another host cannot be checked from here, so it is taken to be alive)."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    return holder.get("host") != socket.gethostname() or pid_alive(pid)


def _holder_alive(run: RunDir, busy: bool) -> bool:
    """`busy`: the flock is held. Then only a recorded holder that is gone frees the run; an
    empty record is a holder between taking the lock and writing its name."""
    holder = read_holder(run)
    if not holder:
        return busy
    return _pid_alive(holder)


def _no_flock(exc: OSError) -> bool:
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _same_file(fd: int, run: RunDir) -> bool:
    try:
        return os.stat(run.lock).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class RunLock:
    """The held lock of one run; `release` (or leaving the `with` block) gives it back."""

    def __init__(self, run: RunDir, fd: int) -> None:
        self.run = run
        self._fd: int | None = fd

    @classmethod
    def try_acquire(cls, run: RunDir) -> RunLock | None:
        """The lock, or None while a live process holds it."""
        while True:
            fd = os.open(run.lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                busy = isinstance(exc, BlockingIOError)
                if not busy and not _no_flock(exc):
                    os.close(fd)
                    raise
                if _holder_alive(run, busy):
                    os.close(fd)
                    return None
                if busy:
                    # Held, but not by the recorded process, which is gone: a child it forked
                    # inherited the lock and outlived it. Set that file aside and start afresh.
                    if _same_file(fd, run):
                        os.unlink(run.lock)
                    os.close(fd)
                    continue
            # The holder may have released (and unlinked) the file between our open and flock: then
            # this lock is on a file nobody else will look at, so start again on the current one.
            if _same_file(fd, run):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_holder_info()).encode())
        return cls(run, fd)

    @classmethod
    def acquire(cls, run: RunDir) -> RunLock:
        """The lock, or RunRefused naming the live process that writes the run."""
        for attempt in range(ATTEMPTS):
            lock = cls.try_acquire(run)
            if lock is not None:
                return lock
            if attempt < ATTEMPTS - 1:
                time.sleep(RETRY_S)
        holder = read_holder(run)
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('started', '?')}"
        raise RunRefused(
            f"run {run.name} is being written by {who}; a second writer would corrupt it "
            "(wait for it to end, or stop that process first)"
        )

    def release(self) -> None:
        """Unlink, then unlock: a waiting writer that opened the old file sees it is gone."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.run.lock)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_held(run: RunDir) -> bool | None:
    """Whether a live process holds the run's lock; None when the run has no lock file (a run
    that ended, or one written before runs had locks)."""
    try:
        fd = os.open(run.lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if isinstance(exc, BlockingIOError) or _no_flock(exc):
            return _holder_alive(run, isinstance(exc, BlockingIOError))
        return None
    finally:
        os.close(fd)
    return False
