"""A pool of ScienceWorld simulators, one JVM per worker process, reused across episodes.

Each worker owns one `ScienceWorldEnv` (py4j starts its JVM as the worker's child with
`die_on_exit`, so the JVM exits when its worker's pipe closes). Workers take the fast step path
(`env.server.step` + score and completion queried separately, 10-30x faster than `env.step`,
which also builds the valid-action list every step). A worker that dies (or whose JVM dies) is
restarted; the request it was serving fails with a clear error and nothing else is affected.

No orphans: workers ask the kernel to SIGKILL them when the parent dies (PR_SET_PDEATHSIG),
ignore SIGINT (the parent shuts them down), and `close()` stops every worker and waits for its
JVM. A pool is a context manager and is also closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from distill.launch import set_parent_death_signal

# The simulator's gold paths depend on JVM identity hash codes (hash-ordered collections), drawn
# in sequence, so on what the JVM loaded before: 3 of the 186 training items took the greenhouse
# or the kitchen, six materialisations gave six training sets, and two builds of the same zoo
# recipes taught OPD and ROSE by different amounts (docs/grid.md). One constant identity hash makes
# every JVM play the same whatever it loaded; gold plays ~20% slower, negligible beside a model.
JVM_DETERMINISM = "-XX:+UnlockExperimentalVMOptions -XX:hashCode=2"

# Marks a simulator reply that reports a failure instead of a result.
ERROR = "error"


class WorkerDied(RuntimeError):
    """The worker process (or its JVM) died while serving a request."""


@dataclass
class StepResult:
    observation: str
    score: int  # 0..100, or negative on an irreversible failure
    done: bool
    moves: int
    seconds: float


class _Simulator:
    """The worker-side simulator: one ScienceWorldEnv (one JVM)."""

    def __init__(self, step_limit: int) -> None:
        self.step_limit = step_limit
        self.env: Any = None
        self.start()

    def start(self) -> None:
        from scienceworld import ScienceWorldEnv

        self.env = ScienceWorldEnv("", envStepLimit=self.step_limit)

    @property
    def jvm_pid(self) -> int:
        return int(self.env._gateway.java_process.pid)

    def jvm_alive(self) -> bool:
        if self.env is None or self.env._gateway.java_process.poll() is not None:
            return False
        try:  # a JVM dying right now may not have exited yet: ask it something cheap
            self.env.server.getNumMoves()
        except Exception:
            return False
        return True

    def stop(self) -> None:
        if self.env is None:
            return
        proc = self.env._gateway.java_process
        try:
            self.env.close()
        except Exception:
            pass
        try:
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait(timeout=5)
        # ScienceWorldEnv.__del__ closes again; it must find nothing left to do.
        self.env.close = lambda: None
        self.env = None

    def reset(self, task: str, variation: int, simplification: str, gold: bool) -> dict[str, Any]:
        env = self.env
        env.load(task, variation, simplification, generateGoldPath=gold)
        description = str(env.server.getTaskDescription())
        # AgentGym's reset: the task description, then the result of "look around".
        observation = str(env.server.step("look around"))
        out: dict[str, Any] = {
            "task_description": description,
            "observation": observation,
            "max_variations": int(env.get_max_variations(task)),
            # Some variations start with partial credit (e.g. already in the right room): an
            # episode whose every turn is unparseable (no simulator step) still ends with it.
            "score": int(round(100 * env.server.getScore())),
        }
        if gold:
            out["gold"] = list(env.get_gold_action_sequence())
        return out

    def step(self, action: str) -> dict[str, Any]:
        server = self.env.server
        observation = str(server.step(action))
        score = int(round(100 * server.getScore()))
        moves = int(server.getNumMoves())
        # The task itself is over (solved, or failed irreversibly), whatever the move count.
        completed = bool(server.getCompleted()) or score < 0
        # The same end condition as ScienceWorldEnv.step, without its per-step valid-action list.
        done = completed or moves > self.step_limit
        return {
            "observation": observation,
            "score": score,
            "done": done,
            "completed": completed,
            "moves": moves,
        }

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "reset":
            return self.reset(*args)
        if name == "step":
            return self.step(*args)
        if name == "valid_actions":
            return list(self.env.get_valid_action_object_combinations())
        if name == "max_variations":
            return {task: int(self.env.get_max_variations(task)) for task in args[0]}
        if name == "splits":
            # The simulator's own train/dev/test variation split of one task (needs a load).
            self.env.load(args[0], 0, "")
            env = self.env
            return {
                "train": env.get_variations_train(),
                "dev": env.get_variations_dev(),
                "test": env.get_variations_test(),
            }
        if name == "jvm_pid":
            return self.jvm_pid
        raise ValueError(f"unknown simulator call {name!r}")


def _worker_main(read_fd: int, write_fd: int, heap: str, step_limit: int) -> None:
    set_parent_death_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["JAVA_TOOL_OPTIONS"] = f"-Xmx{heap} {JVM_DETERMINISM}"
    inbox = Connection(read_fd, writable=False)
    conn = Connection(write_fd, readable=False)
    sim = _Simulator(step_limit)
    conn.send(("ready", sim.jvm_pid))
    try:
        while True:
            try:
                message = inbox.recv()
            except (EOFError, OSError):
                return
            name, args = message
            if name == "close":
                return
            try:
                conn.send(("ok", sim.call(name, args), sim.jvm_pid))
            except Exception as exc:
                # A dead JVM surfaces as a py4j network error: start a fresh one for the next
                # episode, and report this request as failed.
                restarted = ""
                if not sim.jvm_alive():
                    sim.stop()
                    sim.start()
                    restarted = f" (JVM died; restarted as pid {sim.jvm_pid})"
                conn.send((ERROR, f"{type(exc).__name__}: {exc}{restarted}", sim.jvm_pid))
    finally:
        sim.stop()


class _Worker:
    """A worker process (`python -m distill.domains.sciworld.pool`) and its two pipes.

    A plain subprocess rather than multiprocessing: spawn would re-import the caller's main
    module, fork would copy a process that may hold torch's threads.
    """

    def __init__(self, index: int, heap: str, step_limit: int) -> None:
        self.index = index
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        cmd = [sys.executable, "-m", "distill.domains.sciworld.pool"]
        cmd += [str(to_child_r), str(from_child_w), heap, str(step_limit)]
        self.proc = subprocess.Popen(cmd, pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.jvm_pid: int | None = None

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: Any) -> None:
        self.outbox.send(message)

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            raise WorkerDied(f"sciworld worker {self.index} did not start its JVM within {timeout:.0f} s")
        try:
            tag, pid = self.conn.recv()
        except (EOFError, OSError):
            raise WorkerDied(
                f"sciworld worker {self.index} exited while starting its JVM "
                f"(exit code {self.proc.wait(5)}); is Java installed?"
            ) from None
        self.jvm_pid = int(pid)

    def stop(self, timeout: float = 10.0) -> None:
        try:
            self.send(("close", ()))
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.outbox.close()
        self.conn.close()
        # The JVM exits with its worker (die_on_exit); a SIGKILLed worker cannot wait for it.
        if self.jvm_pid is not None:
            _wait_gone(self.jvm_pid, 10.0)


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not pid_running(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pid_running(pid: int) -> bool:
    """True while `pid` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


class EnvPool:
    """`size` simulator workers; callers address a worker by index (one episode per worker)."""

    def __init__(self, size: int, heap: str = "1g", step_limit: int = 100, timeout_s: float = 120.0) -> None:
        if size < 1:
            raise ValueError(f"domain.pool_size must be >= 1, got {size}")
        self.size = size
        self.heap = heap
        self.step_limit = step_limit
        self.timeout_s = timeout_s
        self.restarts = 0
        self._closed = False
        self.workers: list[_Worker] = [self._spawn(i) for i in range(size)]
        for worker in self.workers:
            worker.wait_ready(timeout_s)
        # weakref: an unreachable pool is still shut down at exit without being kept alive.
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            pool = ref()
            if pool is not None:
                pool.close()

        self._atexit = close_at_exit
        atexit.register(close_at_exit)

    def _spawn(self, index: int) -> _Worker:
        return _Worker(index, self.heap, self.step_limit)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def jvm_pids(self) -> list[int]:
        return [w.jvm_pid for w in self.workers if w.jvm_pid is not None]

    def restart(self, index: int) -> None:
        old = self.workers[index]
        old.stop(timeout=2.0)
        worker = self._spawn(index)
        worker.wait_ready(self.timeout_s)
        self.workers[index] = worker
        self.restarts += 1

    def call_many(self, requests: list[tuple[int, str, tuple[Any, ...]]]) -> list[Any]:
        """Send each (worker index, call, args) at once and collect the replies in order.

        A failed request's reply is a `WorkerDied` or `RuntimeError` instance (not raised): the
        other requests complete. A worker that died is restarted before this returns.
        """
        if self._closed:
            raise RuntimeError("EnvPool is closed")
        indices = [index for index, _, _ in requests]
        if len(set(indices)) != len(indices):
            raise ValueError("call_many: one request per worker at a time")
        replies: dict[int, Any] = {}
        pending: dict[int, float] = {}
        for index, name, args in requests:
            worker = self.workers[index]
            try:
                worker.send((name, args))
                pending[index] = time.perf_counter()
            except (OSError, ValueError, BrokenPipeError):
                replies[index] = self._died(index, name)
        while pending:
            # A dead worker's pipe reads EOF, so waiting on the pipes also catches deaths.
            ready = wait([self.workers[index].conn for index in pending], timeout=1.0)
            now = time.perf_counter()
            for index in list(pending):
                worker = self.workers[index]
                if worker.conn in ready or worker.conn.poll():
                    try:
                        tag, value, jvm_pid = worker.conn.recv()
                    except (EOFError, OSError):
                        replies[index] = self._died(index, requests[indices.index(index)][1])
                    else:
                        # The worker reports its JVM with every reply: it may have restarted it.
                        worker.jvm_pid = int(jvm_pid)
                        replies[index] = value if tag == "ok" else RuntimeError(value)
                    del pending[index]
                elif not worker.alive():
                    replies[index] = self._died(index, requests[indices.index(index)][1])
                    del pending[index]
                elif now - pending[index] > self.timeout_s:
                    replies[index] = WorkerDied(
                        f"sciworld worker {index} (pid {worker.pid}) hung for {self.timeout_s:.0f} s on "
                        f"{requests[indices.index(index)][1]}; restarted"
                    )
                    self.restart(index)
                    del pending[index]
        return [replies[index] for index in indices]

    def _died(self, index: int, name: str) -> WorkerDied:
        worker = self.workers[index]
        try:
            code: int | None = worker.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            code = None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        error = WorkerDied(
            f"sciworld worker {index} (pid {worker.pid}, JVM {worker.jvm_pid}) died during {name}: {how}"
        )
        self.restart(index)
        return error

    def call(self, index: int, name: str, *args: Any) -> Any:
        reply = self.call_many([(index, name, args)])[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self.workers:
            worker.stop()
        atexit.unregister(self._atexit)


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
