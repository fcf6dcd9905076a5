"""A teacher whose weights live in its own process: it scores there while the trainer's process
generates and trains (`rollout.async_teacher` with `teacher.engine=hf`).

`WorkerEngine` is the run's teacher engine itself, not a second copy beside an in-process one:
the trainer's process holds the tokenizer (prompts are rendered here, as every engine renders
them: engines/base.py) and what the worker said of its model when it loaded (context, EOS ids,
head rows, `describe()`); the weights are loaded once, in the worker. Scoring, the teacher's
eval (`generate`) and jsd's output head (`output_head`, the one piece the loss needs here) are
requests over a pipe.

The worker is spawned, so it shares no CUDA context or thread pool with the trainer, on its own
device (engines/placement.py: a spare GPU when the node has one for it, else the trainer's,
else the CPU). Tensors come back through torch's shared memory on the host: scores made on a GPU
are copied to the host first, since as CUDA tensors they would pin the worker's blocks until the
trainer freed them (torch's CUDA IPC), and the trainer moves the teacher's scores to its own
device anyway. It exits when asked (`close`), when its parent's end of the pipe closes (the
engine garbage-collected), or with its parent.
"""

from __future__ import annotations

import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from distill.engines.base import ChatPrompts, KVCache
from distill.engines.hf import HFEngine, load_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from distill.config import Sampling
    from distill.engines.base import Completion, TokenScores

START_TIMEOUT_S = 600.0


def _loaded(engine: HFEngine) -> dict[str, Any]:
    """What the parent keeps of the worker's model: all it asks without a request."""
    head = engine.model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    return {
        "describe": engine.describe(),
        "context": engine.context,
        "eos_ids": sorted(engine.eos_ids),
        "head_rows": int(weight.shape[0]) if weight is not None else len(engine.tokenizer),
    }


def _answer(engine: HFEngine, op: str, kwargs: dict[str, Any], on_host: bool) -> Any:
    if op == "score":
        scores = engine.score(**kwargs)
        return scores if on_host else scores.to("cpu")
    if op == "generate":
        return engine.generate(**kwargs)
    if op == "head":
        head = engine.model.get_output_embeddings()
        bias = getattr(head, "bias", None)
        return head.weight.detach().cpu(), None if bias is None else bias.detach().cpu()
    raise ValueError(f"unknown request {op!r}")


def _serve(
    conn: Any, path: str, precision: str, enable_thinking: bool | None, threads: int | None, device: str
) -> None:
    import torch

    try:
        if threads:
            torch.set_num_threads(threads)
        engine = HFEngine.load(path, precision, enable_thinking, device=device)
        on_host = engine.model.device.type == "cpu"
        conn.send(("ready", _loaded(engine)))
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
        op, kwargs = request
        try:
            conn.send(("ok", _answer(engine, op, kwargs, on_host)))
        except Exception as exc:  # noqa: BLE001 - the parent raises it on its side
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))


def _stop(conn: Any, proc: Any) -> None:
    """Ask the worker to exit, and make sure it does (also what the engine's finaliser runs)."""
    try:
        conn.send(None)
    except (OSError, ValueError):
        pass
    proc.join(timeout=10)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
    conn.close()


class WorkerEngine(ChatPrompts):
    """A teacher engine (the `Engine` protocol, less continuation) whose model lives in another
    process; one request at a time."""

    supports_cache = False

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
        role "teacher_worker"); with `wait=False` return at once and let the first request (or
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
        self._stopper = weakref.finalize(self, _stop, self._conn, self._proc)
        self.path = path
        self.enable_thinking = enable_thinking
        self._prompt_cache = {}
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._lock = threading.Lock()
        self._loaded: dict[str, Any] | None = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the worker has loaded its model (a no-op once it has); raise if it could not."""
        with self._lock:
            if self._loaded is not None:
                return
            if not self._conn.poll(START_TIMEOUT_S):
                self.close()
                raise RuntimeError(f"teacher worker: {self.path} not loaded after {START_TIMEOUT_S:g} s")
            kind, value = self._conn.recv()
            if kind != "ready":
                self.close()
                raise RuntimeError(f"teacher worker could not load {self.path}: {value}")
            self._loaded = value

    def _info(self, key: str) -> Any:
        self.wait_ready()
        assert self._loaded is not None
        return self._loaded[key]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """Loaded here on first use (prompts are rendered in the trainer's process)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer

    @property
    def device(self) -> str:
        """Where the worker's model is (waits for it to load)."""
        return str(self._info("describe")["device"])

    @property
    def context(self) -> int | None:
        return self._info("context")

    @property
    def eos_ids(self) -> set[int]:
        return set(self._info("eos_ids"))

    @property
    def head_rows(self) -> int:
        """The rows of the model's output head (the ids it can score)."""
        return int(self._info("head_rows"))

    def describe(self) -> dict[str, Any]:
        """The worker's model as its own engine describes it; `worker_device`: it scored there."""
        record = dict(self._info("describe"))
        return {**record, "worker_device": record["device"]}

    def _request(self, op: str, **kwargs: Any) -> Any:
        self.wait_ready()
        with self._lock:
            try:
                self._conn.send((op, kwargs))
                kind, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise RuntimeError(f"teacher worker stopped (exit code {self._proc.exitcode})") from exc
        if kind != "ok":
            raise RuntimeError(f"teacher worker: {value}")
        return value

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int | None = None,
        top_k: int = 0,
        states: bool = False,
    ) -> TokenScores:
        """`HFEngine.score` in the worker; the tensors come back on the host."""
        return self._request(
            "score",
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=[list(c) for c in completion_ids],
            batch_size=batch_size,
            top_k=top_k,
            states=states,
        )

    def score_topk(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.score(prompt_ids, completion_ids, batch_size, top_k=k).topk()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
        suppress_tokens: Sequence[int] = (),
    ) -> list[Completion]:
        """`HFEngine.generate` in the worker (the teacher's eval), one request per batch of
        `batch_size` rows, so `progress` moves as it does in process."""
        out: list[Completion] = []
        for start in range(0, len(prompt_ids), batch_size):
            chunk = [list(p) for p in prompt_ids[start : start + batch_size]]
            out += self._request(
                "generate",
                prompt_ids=chunk,
                sampling=sampling,
                batch_size=batch_size,
                suppress_tokens=list(suppress_tokens),
            )
            if progress is not None:
                progress(len(chunk))
        return out

    def continue_generate(
        self, ids: Sequence[int], cache: KVCache | None, sampling: Sampling
    ) -> tuple[Completion, KVCache]:
        raise NotImplementedError(
            "a teacher in its worker process scores and evaluates; it does not continue"
        )

    def continue_many(
        self, rows: Sequence[Sequence[int]], caches: Sequence[KVCache | None], sampling: Sampling
    ) -> list[tuple[Completion, KVCache]]:
        raise NotImplementedError(
            "a teacher in its worker process scores and evaluates; it does not continue"
        )

    def output_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's output head (weight, bias), copied to the host: what jsd's loss applies to
        the teacher's hidden states in the trainer's process."""
        return self._request("head")

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        self._stopper()

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()
