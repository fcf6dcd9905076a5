"""A run told to stop for a requeue: checkpoint at the next step boundary, then stop.

SLURM signals a job shortly before its time limit (`sbatch --signal`) and when it is preempted.
A grid cell on SLURM (`distill.grid.cell_job`) starts its run with that signal blocked and names it
in `DISTILL_REQUEUE_SIGNAL`: the run takes it here, in a thread of its own (`sigwait`), and the
trainer's callback (`methods/callbacks.py`) saves a checkpoint at the end of the step in progress and
stops the run with `StopForRequeue`; the requeued job continues it from that checkpoint
(`distill run --resume`), so its final weights are the uninterrupted run's.

Blocked rather than handled: a blocked signal stays pending until the thread takes it (one sent
while the run is still starting up is not lost), and the run's own child processes (the teacher's
worker, graders, simulators) inherit it blocked, so the signal SLURM sends to every process of the
job never kills one of them.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "DISTILL_REQUEUE_SIGNAL"
_requested = threading.Event()
_waiting: threading.Thread | None = None


class StopForRequeue(KeyboardInterrupt):
    """The run checkpointed and stopped to be requeued (recorded as KILLED; `--resume` continues it).
    An interruption, not an error: nothing on the way out may take it for a failure."""


def signal_of(name: str) -> signal.Signals:
    """`USR2` or `SIGUSR2` -> signal.SIGUSR2; ValueError naming it otherwise."""
    try:
        return signal.Signals["SIG" + name.upper().removeprefix("SIG")]
    except KeyError:
        raise ValueError(f"{ENV}={name!r}: no such signal") from None


def block(name: str) -> None:
    """Block the signal in this thread (a child's `preexec_fn`: its whole process tree inherits it)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal_of(name)})


def listen() -> bool:
    """Start taking the requeue signal, when this process was started for it; True if it was.
    Idempotent. The signal must be blocked already (`block`, before the process started)."""
    global _waiting
    name = os.environ.get(ENV)
    if not name:
        return False
    if _waiting is None:
        sig = signal_of(name)
        block(name)  # this thread too, should the process have been started without it
        _waiting = threading.Thread(target=_wait, args=(sig,), name="requeue-signal", daemon=True)
        _waiting.start()
    return True


def _wait(sig: signal.Signals) -> None:
    while True:
        signal.sigwait({sig})
        _requested.set()


def requested() -> bool:
    """The requeue signal has arrived: checkpoint at the end of this step and stop."""
    return _requested.is_set()
