"""A cell's job: the launcher it runs inside its allocation, what travels in its pickle, and which
cells `--resume` resubmits."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
from pathlib import Path

from distill.grid.cell_job import CellJob, CellSpec, launcher_argv
from distill.grid.spec import Cell
from distill.grid.status import CellRow, to_resubmit


def _spec(**kw) -> CellSpec:  # type: ignore[no-untyped-def]
    base = dict(
        label="rlve/opd/s0",
        run_id="g-rlve-opd-s0",
        run_args=["run", "--config", "/g/cells/g-rlve-opd-s0.yaml"],
        workspace="/ws",
        tracking_uri="http://mlflow:5000",
        log="/g/logs/g-rlve-opd-s0.log",
        python="/venv/bin/python",
    )
    base.update(kw)
    return CellSpec(**base)


def test_the_launcher_of_a_cell() -> None:
    assert launcher_argv(_spec()) == [
        "/venv/bin/python",
        "-m",
        "distill",
        "run",
        "--config",
        "/g/cells/g-rlve-opd-s0.yaml",
    ]
    one = launcher_argv(_spec(launcher="accelerate", processes=4), node=0, hosts=["n1"])
    assert one[:3] == ["/venv/bin/python", "-m", "accelerate.commands.launch"]
    assert one[one.index("--num_processes") + 1] == "4" and "--machine_rank" not in one
    assert one[one.index("-m", 2) :] == ["-m", "distill", "run", "--config", "/g/cells/g-rlve-opd-s0.yaml"]
    # Two nodes: each node's launcher knows its rank and meets the others at the first node.
    two = launcher_argv(
        _spec(launcher="accelerate", nodes=2, processes=16), node=1, hosts=["n1", "n2"], port=21234
    )
    opts = two[3 : two.index("-m", 2)]

    def value(flag: str) -> str:
        return opts[opts.index(flag) + 1]

    assert value("--num_machines") == "2" and value("--machine_rank") == "1"
    assert value("--main_process_ip") == "n1" and value("--main_process_port") == "21234"
    assert value("--num_processes") == "16" and opts.count("--num_machines") == 1


def test_the_pickle_holds_the_spec_never_the_child(tmp_path: Path) -> None:
    job = CellJob(_spec())
    job._proc = subprocess.Popen([sys.executable, "-c", "pass"])
    job._proc.wait()
    back = pickle.loads(pickle.dumps(job))
    assert back.spec == job.spec and back._proc is None
    # What submitit requeues: the same cell, continued from its last checkpoint.
    log = tmp_path / "cell.log"
    job = CellJob(_spec(log=str(log)))
    before = signal.getsignal(signal.SIGUSR2)
    try:
        resumed = job.checkpoint().function
        # Once signalled, the job takes no second signal (it would requeue before the checkpoint).
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert isinstance(resumed, CellJob) and resumed.spec.run_args == ["run", "--resume", "g-rlve-opd-s0"]
    assert "requeued" in log.read_text()


def _row(label: str, state: str, status: str) -> CellRow:
    d, m, s = label.split("/")
    return CellRow(Cell(d, m, int(s[1:])), "1_0" if state != "-" else "-", state, status, 0, 6)


def test_resume_takes_the_dead_and_never_the_finished_or_the_queued() -> None:
    rows = [
        _row("rlve/sft/s0", "COMPLETED", "FINISHED"),
        _row("rlve/sft/s1", "RUNNING", "RUNNING"),
        _row("rlve/opd/s0", "PENDING", "NEW"),
        _row("rlve/opd/s1", "REQUEUED", "KILLED"),
        _row("rlve/rose/s0", "CANCELLED", "DIED"),
        _row("rlve/rose/s1", "TIMEOUT", "DIED"),
        _row("rlve/opsd/s0", "FAILED", "FAILED"),
        _row("rlve/opsd/s1", "PREEMPTED", "KILLED"),
        _row("dapo/sft/s0", "-", "NEW"),  # never submitted
        _row("dapo/sft/s1", "UNKNOWN", "FINISHED"),  # SLURM forgot the job; the run is done
    ]
    again = [row.cell.label for row in to_resubmit(rows)]
    assert again == ["rlve/rose/s0", "rlve/rose/s1", "rlve/opsd/s0", "rlve/opsd/s1", "dapo/sft/s0"]
