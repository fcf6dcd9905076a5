"""One grid cell as a SLURM job: what submitit runs inside the cell's allocation.

The job starts the cell's own launcher (`distill run`, or `accelerate launch` over the cell's GPUs
and nodes) as a child process and waits for it. SLURM signals the job before its time limit and at
preemption (submitit asks for `--signal=USR2@<slurm.signal_delay_s>`): submitit's handler in this
process calls `checkpoint`, which passes the signal on to the run (it checkpoints at its next step
boundary and stops, `distill.requeue`) and hands submitit the job to requeue: `distill run --resume`
of the same run, from that checkpoint. Imported by every cell job: nothing heavy at module level.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from distill import requeue
from distill.launch import accelerate_argv

# The seconds a run gets to end on its own once stopped by SIGTERM, before SIGKILL.
TERM_WAIT_S = 20.0
POLL_S = 0.5


class CellFailed(RuntimeError):
    """The cell's run ended with a non-zero exit: the job is FAILED (its log says why)."""


@dataclass
class CellSpec:
    """What a cell's job needs to know, pickled with it (plain values only)."""

    label: str
    run_id: str
    run_args: list[str]
    workspace: str
    tracking_uri: str
    log: str
    python: str = sys.executable
    launcher: str = "process"
    nodes: int = 1
    processes: int = 1
    accelerate_config: str | None = None
    signal_name: str = "USR2"
    # The longest the job waits for the run's checkpoint once signalled (its signal delay, less
    # the time the requeue itself takes).
    grace_s: float = 60.0


def launcher_argv(
    spec: CellSpec, node: int = 0, hosts: list[str] | None = None, port: int = 29500
) -> list[str]:
    """The cell's launcher command on node `node` of its allocation (`hosts`: the nodes' names)."""
    if spec.launcher == "process":
        return [spec.python, "-m", "distill", *spec.run_args]
    config = Path(spec.accelerate_config) if spec.accelerate_config else None
    argv = accelerate_argv(spec.run_args, config, spec.processes)
    argv[0] = spec.python
    if spec.nodes == 1:
        return argv
    # One `accelerate launch` per node, meeting at the first node's address.
    at = argv.index("-m", 2)  # `python -m accelerate.commands.launch [options] -m distill run ...`
    options = _without(argv[3:at], "--num_machines", "--main_process_port")
    machines = ["--num_machines", str(spec.nodes), "--machine_rank", str(node)]
    machines += ["--main_process_ip", (hosts or ["localhost"])[0], "--main_process_port", str(port)]
    return [*argv[:3], *options, *machines, *argv[at:]]


def _without(args: list[str], *flags: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


class CellJob(Checkpointable):
    """submitit's callable for one cell: run the launcher; on the requeue signal, checkpoint."""

    def __init__(self, spec: CellSpec) -> None:
        self.spec = spec
        self._proc: subprocess.Popen[bytes] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}  # never the running child

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec, self._proc = state["spec"], None

    def __call__(self) -> str:
        from submitit import JobEnvironment

        job = JobEnvironment()
        argv = launcher_argv(self.spec, job.node, list(job.hostnames), 20000 + int(job.raw_job_id) % 20000)
        log = Path(self.spec.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        self._note(f"job {job.job_id} on {job.hostname}: {' '.join(argv)}")
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self._env()},
                # The run takes the signal itself (`distill.requeue`); blocked from birth, it is
                # never lost during start-up and never kills one of the run's own children.
                preexec_fn=lambda: requeue.block(self.spec.signal_name),
                start_new_session=True,  # its process group: the signal reaches every rank
            )
            code = self._wait(self._proc)
        if code != 0:
            raise CellFailed(f"{self.spec.label}: {argv[2]} exited {code}; see {log}")
        return f"{self.spec.label}: done"

    def _note(self, text: str) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        with Path(self.spec.log).open("a") as out:
            out.write(f"== {stamp} {text}\n")

    def _env(self) -> dict[str, str]:
        return {
            "DISTILL_WORKSPACE": self.spec.workspace,
            "DISTILL_TRACKING_URI": self.spec.tracking_uri,
            requeue.ENV: self.spec.signal_name,
        }

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], until: float | None = None) -> int | None:
        # A polling wait, never `proc.wait()`: submitit's signal handler runs in this thread and
        # waits for the same child (`Popen.wait` would hold a lock the handler needs).
        while (code := proc.poll()) is None:
            if until is not None and time.monotonic() >= until:
                return None
            time.sleep(POLL_S)
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Called by submitit when SLURM signals the job: pass the signal to the run, wait for its
        checkpoint, and requeue the job as `distill run --resume` (a run that could not end in
        time is stopped; it then continues from its last periodic checkpoint)."""
        sig = requeue.signal_of(self.spec.signal_name)
        # Once: a second signal (a preemption after the time-limit warning; a signal SLURM sends
        # again) would run submitit's handler inside this one and requeue before the checkpoint.
        signal.signal(sig, signal.SIG_IGN)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc, sig)
            if self._wait(proc, time.monotonic() + self.spec.grace_s) is None:
                _signal_group(proc, signal.SIGTERM)
                if self._wait(proc, time.monotonic() + TERM_WAIT_S) is None:
                    _signal_group(proc, signal.SIGKILL)
                    self._wait(proc)
        code = proc.returncode if proc is not None else None
        self._note(f"SIG{self.spec.signal_name} (time limit or preemption): run exited {code}; requeued")
        return DelayedSubmission(CellJob(replace(self.spec, run_args=["run", "--resume", self.spec.run_id])))


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
