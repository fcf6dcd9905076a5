"""One writer per run directory: `run.lock`, held for as long as a process writes the run.

Where the file system has `flock` (local disks, NFSv4), the lock is an `flock` on `<run>/run.lock`:
the kernel drops it the moment its process dies, by SIGKILL included, so a stale lock is one
nobody holds and the next writer takes it. The file records who holds it (pid, host, start time
and a random token) for the refusal message. Taking, setting aside and giving back the lock
happen under a second, momentary `flock` on `<run>/run.lock.guard` (never removed), so:

- a writer's `flock` and its record are one step to every other writer: a held lock always
  carries its holder's record, never the previous holder's;
- the one case where the `flock` is held but nobody writes the run (a child forked by a writer
  that is gone inherited the lock and outlived it) is told apart by the recorded pid, on this
  host, and only then is the file set aside for a new one;
- a writer gives back only its own file (same inode): it never removes another writer's lock.

`flock` locks belong to one open file: a second `open` in the holding process conflicts too, so
a process cannot take its own run twice.

Where the file system has no `flock` (some network and FUSE mounts), the lock file is created
exclusively (`O_EXCL`), its record inside; the holder touches it every `HEARTBEAT_S`. A record is
stale when its pid is gone (this host) or, for another host, when the file has not been touched
for `STALE_S` (that host's clock against this one's; a holder stopped for longer is taken to be
gone). Contenders that find the same stale record race to link it to one claim name; only the
one that makes the link removes it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
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

    @property
    def lock_guard(self) -> Path: ...


# A probe (`lock_held`, from `distill runs`) or a writer taking its lock holds a flock for
# microseconds: a writer that meets one retries briefly before refusing.
ATTEMPTS = 4
RETRY_S = 0.05
# The guard is held only while a lock is taken or given back; waiting longer means a process
# stopped in the middle of that (SIGSTOP): refuse rather than hang.
GUARD_WAIT_S = 5.0
# Without flock: the holder's heartbeat, and how long another host's silent record is trusted.
HEARTBEAT_S = 30.0
STALE_S = 600.0
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC


def _holder_info() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "token": secrets.token_hex(8),
    }


def _parse(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def read_holder(run: RunDir) -> dict[str, Any]:
    """Who holds (or last held) the run's lock, as recorded in the file; {} when unreadable."""
    try:
        return _parse(run.lock.read_text())
    except OSError:
        return {}


def _read_fd(fd: int) -> dict[str, Any]:
    """The record in the file `fd` has open (not the one at the path, which may be another)."""
    return _parse(os.pread(fd, 1 << 16, 0).decode(errors="replace"))


def _write_record(fd: int, info: dict[str, Any]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _same_host_gone(holder: dict[str, Any]) -> bool:
    """The recorded holder ran on this host and its process no longer exists."""
    pid = holder.get("pid")
    return isinstance(pid, int) and holder.get("host") == socket.gethostname() and not pid_alive(pid)


def _alive_without_flock(holder: dict[str, Any], touched: float) -> bool:
    """No flock to ask: this host's holder while its pid exists, another host's while it keeps
    touching the file (an unreadable record: while the file is fresh, a holder writing it)."""
    if holder and holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        return pid_alive(holder["pid"])
    return time.time() - touched < STALE_S


def _no_flock(exc: OSError) -> bool:
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class NoFlock(Exception):
    """The run's file system has no flock."""


@contextlib.contextmanager
def _guard(run: RunDir) -> Iterator[None]:
    """Held while a lock is taken, set aside or given back (microseconds); NoFlock without flock."""
    fd = os.open(run.lock_guard, OPEN_FLAGS, 0o644)
    try:
        deadline = time.monotonic() + GUARD_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RunRefused(
                        f"run {run.name}: another process has been taking its lock for {GUARD_WAIT_S:.0f} s "
                        f"(stopped?); see {run.lock_guard}"
                    ) from None
                time.sleep(0.001)
            except OSError as exc:
                if _no_flock(exc):
                    raise NoFlock from None
                raise
        yield
    finally:
        os.close(fd)  # closing drops the flock


class _Heartbeat:
    """Touches a lock file every HEARTBEAT_S, so other hosts see its holder alive (no flock)."""

    def __init__(self, fd: int) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fd,), name="run-lock-heartbeat", daemon=True)
        self._thread.start()

    def _run(self, fd: int) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(fd)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class RunLock:
    """The held lock of one run; `release` (or leaving the `with` block) gives it back."""

    def __init__(self, run: RunDir, fd: int, token: str, flock: bool) -> None:
        self.run = run
        self.token = token
        self._fd: int | None = fd
        self._flock = flock
        self._heartbeat = None if flock else _Heartbeat(fd)

    @classmethod
    def try_acquire(cls, run: RunDir) -> RunLock | None:
        """The lock, or None while a live process holds it."""
        try:
            with _guard(run):
                return cls._take_flock(run)
        except NoFlock:
            return cls._take_exclusive(run)

    @classmethod
    def _take_flock(cls, run: RunDir) -> RunLock | None:
        # Under the guard: the path changes only here and in `release`, both guarded.
        for _ in range(2):  # a second pass after setting an orphaned file aside
            fd = os.open(run.lock, OPEN_FLAGS, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_fd(fd)
                # Busy and the recorded writer gone from this host: a child it forked holds the
                # flock on. Anything else that holds it is a writer (or a probe, for microseconds).
                if _same_host_gone(holder) and _same_file(fd, run.lock):
                    os.unlink(run.lock)
                    os.close(fd)
                    continue
                os.close(fd)
                return None
            except OSError:
                os.close(fd)
                raise
            return cls._taken(run, fd, flock=True)
        return None

    @classmethod
    def _take_exclusive(cls, run: RunDir) -> RunLock | None:
        for _ in range(2):  # a second pass after removing a stale record
            try:
                fd = os.open(run.lock, OPEN_FLAGS | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    fd = os.open(run.lock, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # given back meanwhile
                try:
                    holder, seen = _read_fd(fd), _fingerprint(fd)
                finally:
                    os.close(fd)
                if _alive_without_flock(holder, seen[1] / 1e9):
                    return None
                _remove_stale(run, seen)
                continue
            return cls._taken(run, fd, flock=False)
        return None

    @classmethod
    def _taken(cls, run: RunDir, fd: int, flock: bool) -> RunLock:
        """The lock on `fd`, just taken: its holder's record written in."""
        info = _holder_info()
        _write_record(fd, info)
        return cls(run, fd, info["token"], flock)

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
        """Remove the lock file if it is still this lock's, then unlock: a writer waiting on the
        old file finds it gone, and another writer's file is never removed."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self._heartbeat is not None:
                self._heartbeat.stop()
                if _read_fd(fd).get("token") == self.token and _same_file(fd, self.run.lock):
                    os.unlink(self.run.lock)
            else:
                with contextlib.suppress(RunRefused), _guard(self.run):
                    if _same_file(fd, self.run.lock):
                        os.unlink(self.run.lock)
        except (OSError, NoFlock):
            pass  # a file left behind is one nobody holds: the next writer takes it
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _fingerprint(fd: int) -> tuple[int, int, bytes]:
    """A lock file as judged: inode, modification time and record. A file made after it differs
    in one of them even where the file system hands out the freed inode again."""
    return os.fstat(fd).st_ino, os.fstat(fd).st_mtime_ns, os.pread(fd, 1 << 16, 0)


def _remove_stale(run: RunDir, seen: tuple[int, int, bytes]) -> None:
    """Remove the lock file judged stale (`seen`) unless it changed meanwhile. Every contender
    that judged it stale links it to the same claim name; the link exists for one of them at a
    time, and that one removes the file only if the claim is that very file."""
    claim = run.lock.with_name(f"{run.lock.name}.stale-{seen[0]}")
    try:
        os.link(run.lock, claim)
    except FileExistsError:
        with contextlib.suppress(OSError):  # a claim its maker left (it died): free it
            if time.time() - claim.stat().st_mtime > STALE_S:
                claim.unlink()
        return
    except FileNotFoundError:
        return
    try:
        fd = os.open(claim, os.O_RDONLY | os.O_CLOEXEC)
        try:
            same = _fingerprint(fd) == seen
        finally:
            os.close(fd)
        if same:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(run.lock)
    finally:
        with contextlib.suppress(FileNotFoundError):
            claim.unlink()


def lock_held(run: RunDir) -> bool | None:
    """Whether a live process holds the run's lock; None when the run has no lock file (a run
    that ended, or one written before runs had locks). Asked under the guard, so a writer caught
    between its flock and its record is never read as the previous, dead holder."""
    if not run.lock.exists():
        return None
    try:
        with _guard(run):
            return _probe(run)
    except (NoFlock, RunRefused):
        return _probe(run)


def _probe(run: RunDir) -> bool | None:
    try:
        fd = os.open(run.lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Held; by a writer unless the recorded one is gone (a forked child keeps it).
        return not _same_host_gone(_read_fd(fd))
    except OSError as exc:
        if _no_flock(exc):
            return _alive_without_flock(_read_fd(fd), os.fstat(fd).st_mtime)
        return None
    finally:
        os.close(fd)
    return False
