"""The requeue signal in a real process: started blocked, it is taken once the run listens (a
signal sent during start-up is not lost), and the run's own child processes, which inherit it
blocked, are not killed by it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from distill import requeue

# A "run": listens late (as the trainer callback does), keeps a child process of its own, and
# reports what it saw once the signal is taken.
RUN = """
import subprocess, sys, time
from distill import requeue
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("child", child.pid, flush=True)
time.sleep(1.0)  # the signal arrives before the run listens
assert requeue.listen()
deadline = time.time() + 30
while not requeue.requested() and time.time() < deadline:
    time.sleep(0.05)
print("requested", requeue.requested(), "child alive", child.poll() is None, flush=True)
child.kill()
"""


def test_a_signal_sent_before_the_run_listens_is_taken_and_spares_its_children(tmp_path: Path) -> None:
    env = {**os.environ, requeue.ENV: "USR2"}
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: requeue.block("USR2"),
        start_new_session=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("child "), first
    os.killpg(proc.pid, signal.SIGUSR2)  # as SLURM signals every process of the job
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "requested True child alive True" in out


def test_without_the_variable_nothing_listens(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(requeue.ENV, raising=False)
    assert requeue.listen() is False and requeue.requested() is False
    assert requeue.signal_of("usr2") == signal.SIGUSR2 == requeue.signal_of("SIGUSR2")


def test_unblocked_the_same_signal_kills_the_child() -> None:
    """What the blocking is for: a plain process dies of it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    time.sleep(0.3)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=30) == -signal.SIGUSR2
