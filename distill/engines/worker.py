"""An HFEngine in its own process: the teacher scores there while the trainer's process generates
and trains (`rollout.async_teacher` with `teacher.engine=hf`).

The worker loads the model itself (spawned, so it shares no CUDA context or thread pool with the
trainer) on its own device (engines/placement.py: a GPU no trainer uses, else the trainer's, else
the CPU) and answers `score` requests over a pipe; tensors come back through torch's shared
memory on the host. Scores made on a GPU are copied to the host first: sent as CUDA tensors they
would pin the worker's blocks until the trainer frees them (torch's CUDA IPC), and the trainer
moves the teacher's scores to its own device anyway. It exits when asked, when its parent's end
of the pipe closes, or with its parent.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distill.engines.hf import HFEngine

if TYPE_CHECKING:
    from distill.engines.base import TokenScores

START_TIMEOUT_S = 600.0


def _serve(
    conn: Any, path: str, precision: str, enable_thinking: bool | None, threads: int | None, device: str
) -> None:
    import torch

    try:
        if threads:
            torch.set_num_threads(threads)
        engine = HFEngine.load(path, precision, enable_thinking, device=device)
        on_host = engine.model.device.type == "cpu"
        conn.send(("ready", str(engine.model.device)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then this process ends
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if request is None:
            return
        kwargs = request
        try:
            scores = engine.score(**kwargs)
            conn.send(("ok", scores if on_host else scores.to("cpu")))
        except Exception as exc:  # noqa: BLE001 - the parent raises it on its side
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))


class WorkerEngine:
    """`score` of an HFEngine that lives in another process (one request at a time)."""

    def __init__(
        self,
        path: str,
        precision: str = "fp32",
        enable_thinking: bool | None = None,
        threads: int | None = None,
        wait: bool = True,
        device: str = "cpu",
    ):
        """Spawn the worker, its model on `device` (a torch device string: placement.place with
        role "teacher_worker"); with `wait=False` return at once and let the first `score` (or
        `wait_ready`) wait for the model to load, so the caller's own set-up overlaps it."""
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self._proc = context.Process(
            target=_serve,
            args=(child, path, precision, enable_thinking, threads, device),
            name="distill-teacher",
            daemon=True,
        )
        self._proc.start()
        child.close()
        self._path = path
        self._ready = False
        self._device: str | None = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the worker has loaded its model (a no-op once it has); raise if it could not."""
        if self._ready:
            return
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"teacher worker: {self._path} not loaded after {START_TIMEOUT_S:g} s")
        kind, value = self._conn.recv()
        if kind != "ready":
            self.close()
            raise RuntimeError(f"teacher worker could not load {self._path}: {value}")
        self._ready = True
        self._device = value

    @property
    def device(self) -> str:
        """Where the worker's model is (waits for it to load): the manifest's worker device."""
        self.wait_ready()
        assert self._device is not None
        return self._device

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        top_k: int = 0,
        states: bool = False,
    ) -> TokenScores:
        request = {
            "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": [list(c) for c in completion_ids],
            "top_k": top_k,
            "states": states,
        }
        self.wait_ready()
        try:
            self._conn.send(request)
            kind, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"teacher worker stopped (exit code {self._proc.exitcode})") from exc
        if kind != "ok":
            raise RuntimeError(f"teacher worker: {value}")
        return value

    def close(self) -> None:
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=5)
        self._conn.close()
