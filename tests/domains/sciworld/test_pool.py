"""The simulator pool: no JVM outlives a run, a crash or Ctrl-C; a killed worker fails one episode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distill.domains.sciworld import SciWorldDomain, item_of
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.domains.sciworld.index import IndexEntry
from distill.domains.sciworld.pool import EnvPool, pid_running
from distill.episodes.play import play
from distill.evals.agent import summarize_episodes

from .conftest import gold

pytestmark = pytest.mark.integration


def items(variations: list[int]) -> list:
    return [
        item_of(IndexEntry(index=v, task_id="4-2", task_name="find-non-living-thing", variation=v))
        for v in variations
    ]


def wait_gone(pids: list[int], timeout: float = 60.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [p for p in pids if pid_running(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_running(p)]


def test_no_jvm_left_after_close() -> None:
    with EnvPool(1) as pool:
        jvms, workers = pool.jvm_pids, [w.pid for w in pool.workers]
        assert len(jvms) == 1 and all(pid_running(p) for p in jvms + workers)
        domain = SciWorldDomain(SciWorldDomainConfig(tasks=["4-2"]), pool=pool)
        episodes = play(domain, items([1]), lambda ep: gold(), None, None, gold=True)
        assert [ep.score for ep in episodes] == [100]
    assert wait_gone(jvms + workers, timeout=1.0) == []


# A run that holds a pool mid-episode, for the crash and Ctrl-C cases.
HOLDER = """
import json, sys, time
from distill.domains.sciworld.pool import EnvPool
pool = EnvPool(1)
pool.call(0, "reset", "find-non-living-thing", 0, "", False)
print(json.dumps({"jvms": pool.jvm_pids, "workers": [w.pid for w in pool.workers]}), flush=True)
while True:
    pool.call(0, "step", "look around")
    time.sleep(0.05)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "crash"])
def test_no_jvm_left_after_ctrl_c_or_crash(sig: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As in a terminal: a test run from a background job (`.ci/run &`) inherits SIGINT ignored,
        # and Python then never raises KeyboardInterrupt, so the holder would not see the Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        pids = json.loads(line)
        assert all(pid_running(p) for p in pids["jvms"] + pids["workers"])
        if sig == signal.SIGINT:
            # Ctrl-C reaches the whole foreground process group, as in a terminal.
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.kill()
        proc.wait(90)  # a JVM shutting down on a loaded 2-core CI machine can take tens of seconds
        assert wait_gone(pids["jvms"] + pids["workers"]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_killed_worker_fails_only_its_episode(sw_pool: EnvPool) -> None:
    victim = "sciworld_6"
    killed: dict[str, int] = {}

    def kill_mid_episode(ep) -> None:  # type: ignore[no-untyped-def]
        if ep.item.id == victim and len(ep.turns) == 2 and not killed:
            worker = sw_pool.workers[ep.worker]
            killed.update(worker=worker.pid, jvm=worker.jvm_pid or 0)
            os.kill(worker.pid, signal.SIGKILL)

    restarts = sw_pool.restarts
    batch = items([5, 6, 9])
    domain = SciWorldDomain(SciWorldDomainConfig(tasks=["4-2"]), pool=sw_pool)
    episodes = play(domain, batch, lambda ep: gold(), None, None, gold=True, on_turn=kill_mid_episode)
    by_id = {ep.item.id: ep for ep in episodes}
    failed = by_id[victim]
    assert failed.error is not None
    assert "died during step" in failed.error and "killed by signal 9" in failed.error
    assert failed.error.startswith("turn 2 ")
    record = failed.record(domain)
    assert record["error"] == failed.error and record["turns"] == 2 and record["success"] is False
    for ep in episodes:
        if ep.item.id != victim:
            assert ep.error is None and ep.score == 100, ep.item.id
    assert sw_pool.restarts == restarts + 1
    # the eval counts the failed episode as score 0 and says so
    metrics = summarize_episodes(episodes, domain)
    assert metrics["failed"] == 1 and metrics["success"] == pytest.approx(2 / 3)
    assert metrics["score"] == pytest.approx(2 / 3) and metrics["pass_gt0"] == pytest.approx(2 / 3)
    assert wait_gone([killed["worker"], killed["jvm"]]) == []
    # the restarted worker serves the next episode
    (again,) = play(domain, items([6]), lambda ep: gold(), None, None, gold=True)
    assert again.error is None and again.score == 100


def test_dead_jvm_is_restarted_inside_its_worker(sw_pool: EnvPool) -> None:
    worker = sw_pool.workers[0]
    old_jvm = worker.jvm_pid
    assert old_jvm is not None
    sw_pool.call(0, "reset", "find-non-living-thing", 1, "", False)
    os.kill(old_jvm, signal.SIGKILL)
    assert wait_gone([old_jvm]) == []
    reply = sw_pool.call_many([(0, "step", ("look around",))])[0]
    assert isinstance(reply, RuntimeError) and "JVM died; restarted" in str(reply)
    new_jvm = sw_pool.call(0, "jvm_pid")
    assert new_jvm != old_jvm and pid_running(new_jvm)
    assert worker.jvm_pid == new_jvm
    sw_pool.call(0, "reset", "find-non-living-thing", 1, "", False)
    assert sw_pool.call(0, "step", "look around")["observation"].startswith("This room is called")


def test_pool_size_is_validated() -> None:
    with pytest.raises(ValueError, match="pool_size"):
        EnvPool(0)


def test_workers_cap_the_jvm_heap(sw_pool: EnvPool) -> None:
    jvm = sw_pool.workers[0].jvm_pid
    environ = Path(f"/proc/{jvm}/environ").read_bytes().decode().split("\0")
    (options,) = [e.removeprefix("JAVA_TOOL_OPTIONS=") for e in environ if e.startswith("JAVA_TOOL_OPTIONS=")]
    assert "-Xmx1g" in options.split() and "-XX:hashCode=2" in options.split()


# Training items whose gold path took the greenhouse or the kitchen depending on what the JVM had
# loaded before (identity hash codes drawn in sequence): six materialisations of the training
# set, six different sets.
WANDERING = [
    ("lifespan-longest-lived-then-shortest-lived", 38),
    ("lifespan-longest-lived", 12),
    ("lifespan-longest-lived", 84),
]


def test_a_jvm_plays_the_same_gold_path_whatever_it_loaded_before(sw_pool: EnvPool) -> None:
    def golds() -> list[list[str]]:
        return [sw_pool.call(0, "reset", task, variation, "", True)["gold"] for task, variation in WANDERING]

    first = golds()
    assert all(len(path) >= 8 for path in first)
    for block in range(3):
        for variation in range(3 * block, 3 * block + 3):
            sw_pool.call(0, "reset", "lifespan-longest-lived", variation, "", True)
        assert golds() == first
