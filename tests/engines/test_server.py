"""The server engine without a vLLM server: config, launcher flags, failures that must be loud,
and the engine-level top-k scoring both engines share (hf numerics unchanged)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from distill.config import RunConfig, Sampling, ServerClientConfig, resolve_config
from distill.engines.compat import check_config, served_teacher_reason
from distill.engines.hf import HFEngine
from distill.engines.server import ServerEngine, ServerError
from distill.engines.vllm_server import ServeOptions, find_vllm, serve_command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_config_server_engine_fields() -> None:
    cfg = RunConfig.model_validate(
        {"teacher": {"name": "zoo:teacher", "engine": "server", "url": "http://h:1"}}
    )
    assert cfg.teacher.engine == "server" and cfg.teacher.server.retries >= 0
    with pytest.raises(ValueError, match="engine=server needs url"):
        RunConfig.model_validate({"teacher": {"name": "zoo:teacher", "engine": "server"}})
    with pytest.raises(ValueError, match="student.engine=server is not supported"):
        RunConfig.model_validate(
            {"student": {"name": "zoo:student", "engine": "server", "url": "http://h:1"}}
        )
    with pytest.raises(ValueError, match="concurrency"):
        ServerClientConfig(concurrency=0)
    # The documented override alone keeps the default teacher model (its tokenizer is loaded locally).
    resolved = resolve_config(
        "rlve", "opd", None, ["teacher.engine=server", "teacher.url=http://127.0.0.1:8000"]
    )
    assert (resolved.teacher.name, resolved.teacher.engine) == ("zoo:teacher", "server")


def test_methods_that_need_teacher_weights_are_refused() -> None:
    served = {"name": "zoo:teacher", "engine": "server", "url": "http://h:1"}
    assert served_teacher_reason(RunConfig.model_validate({"teacher": served})) is None
    topk = RunConfig.model_validate({"teacher": served, "method": {"name": "opd", "loss": "forward_kl_topk"}})
    assert served_teacher_reason(topk) is None
    jsd = RunConfig.model_validate({"teacher": served, "method": {"name": "opd", "loss": "jsd"}})
    with pytest.raises(ValueError, match="teacher.engine=server: method.loss=jsd needs the teacher's hidden"):
        check_config(jsd)
    opsd = RunConfig.model_validate({"method": {"name": "opsd"}})
    assert "opsd" in str(served_teacher_reason(opsd))
    episodes = RunConfig.model_validate(
        {"teacher": served, "domain": {"name": "sciworld"}, "method": {"name": "rose"}}
    )
    with pytest.raises(ValueError, match="teacher.engine=server: the episode methods on sciworld"):
        check_config(episodes)


def test_cli_refuses_jsd_with_a_served_teacher_before_any_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "distill",
            "run",
            "--domain",
            "rlve",
            "--method",
            "opd",
            "method.loss=jsd",
            "teacher.engine=server",
            "teacher.url=http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DISTILL_WORKSPACE": str(tmp_path)},
    )
    assert proc.returncode == 2 and "method.loss=jsd" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_down_server_fails_fast_naming_the_url(tiny_zoo: Any) -> None:
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    with pytest.raises(
        ServerError, match=rf"127\.0\.0\.1:{port}/v1/models failed model list after 2 attempts"
    ):
        ServerEngine.load(
            str(tiny_zoo.teacher), url, ServerClientConfig(retries=1, backoff_s=0.05, timeout_s=2)
        )
    assert time.monotonic() - start < 10


def test_silent_server_times_out_instead_of_hanging(tiny_zoo: Any) -> None:
    """A server that accepts but never answers: each attempt ends at timeout_s, then a clear error."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ServerError, match="timeout 0.5s each"):
            ServerEngine.load(
                str(tiny_zoo.teacher), url, ServerClientConfig(retries=1, backoff_s=0, timeout_s=0.5)
            )
        assert time.monotonic() - start < 5


def test_served_teacher_has_no_weights_here(tiny_zoo: Any) -> None:
    from transformers import AutoTokenizer

    engine = ServerEngine("http://127.0.0.1:9", AutoTokenizer.from_pretrained(str(tiny_zoo.teacher)), "m")
    assert getattr(engine, "model", None) is None and not engine.supports_cache
    hf = HFEngine.load(str(tiny_zoo.teacher))
    # Same rendering code: prompts are token-for-token the hf engine's.
    assert engine.prompt_ids("Sort: 3 1 2") == hf.prompt_ids("Sort: 3 1 2")
    assert engine.eos_ids >= {hf.tokenizer.eos_token_id}


def test_serve_command_flags() -> None:
    cmd = serve_command(Path("/venv/bin/python"), "/models/t", ServeOptions(port=8123, precision="fp32"))
    joined = " ".join(cmd)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in (
        "--model /models/t",
        "--port 8123",
        "--max-logprobs -1",
        "--dtype float32",
        "--gpu-memory-utilization 0.1",
        "--host 127.0.0.1",
        "--enable-scale-out",
    ):
        assert flag in joined


def test_serve_env_on_a_shared_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from distill.engines.vllm_server import serve_env

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    shared = serve_env(2)
    assert (shared["OMP_NUM_THREADS"], shared["VLLM_CPU_OMP_THREADS_BIND"]) == ("2", "nobind")
    # With threads given, the engine runs in the API server's process (no busy-polling worker).
    assert shared["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and "PYTHONPATH" not in shared
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in serve_env()  # vLLM's own defaults (a GPU)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the caller's choice wins
    assert serve_env(2)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_cli_serve_teacher_dry_run_resolves_the_model(tiny_zoo: Any, tmp_path: Path) -> None:
    env = {"DISTILL_VLLM_PYTHON": "/opt/somewhere/python", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "distill",
            "serve",
            "teacher",
            "--model",
            str(tiny_zoo.teacher),
            "--port",
            "8999",
            "--dry-run",
            "--",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("/opt/somewhere/python -m vllm.entrypoints.openai.api_server --model ")
    assert str(tiny_zoo.teacher) in proc.stdout and "--max-logprobs -1" in proc.stdout
    assert proc.stdout.rstrip().endswith("--seed 3")


def test_cli_serve_teacher_without_vllm_is_a_clear_error(tmp_path: Path) -> None:
    env = {"DISTILL_VLLM_VENV": str(tmp_path / "none"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "distill", "serve", "teacher", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if find_vllm() is not None and "vllm" in sys.modules:  # pragma: no cover - vllm in this venv
        pytest.skip("vllm is importable from distill's own interpreter")
    assert proc.returncode == 2
    assert "no vLLM environment found" in proc.stderr and "scripts/vllm-env.sh" in proc.stderr


def test_hf_score_topk_matches_the_trainer_layout(tiny_zoo: Any) -> None:
    """score_topk equals the former in-trainer computation (left-padded prompts, right-padded
    completions through the decoder and head), and its logprobs agree with score()."""
    from distill.kernels.states import completion_states

    engine = HFEngine.load(str(tiny_zoo.teacher))
    prompts = [engine.prompt_ids(p) for p in ("What is 3 times 4?", "Sort: 3 1 2", "hi")]
    completions = [c.ids for c in engine.generate(prompts, Sampling(7))]
    completions[2] = completions[2][:3]  # rows of different lengths
    k = 5
    ids_B_T_K, logps_B_T_K = engine.score_topk(prompts, completions, k)
    width = max(len(c) for c in completions)
    assert ids_B_T_K.shape == logps_B_T_K.shape[:2] + (k,) == (3, width, k)

    tp_ids, tp_mask = engine.left_pad(prompts)
    comp = torch.full((3, width), engine.tokenizer.pad_token_id)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, row in enumerate(completions):
        comp[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        hidden = completion_states(engine.model, tp_ids, tp_mask, comp, mask)
        top = torch.log_softmax(engine.model.get_output_embeddings()(hidden).float(), -1).topk(k, -1)
    keep = mask.bool()
    # The chunked head (kernels/heads.py) against the full-vocabulary log_softmax it replaces.
    assert torch.equal(ids_B_T_K[keep], top.indices[keep])
    assert torch.allclose(logps_B_T_K[keep], top.values[keep], atol=1e-5)
    assert not logps_B_T_K[~keep].any()

    sampled = engine.score(prompts, completions).rows()
    for i, row in enumerate(completions):
        for t, tok in enumerate(row):
            hit = (ids_B_T_K[i, t] == tok).nonzero()
            if len(hit):
                assert abs(float(logps_B_T_K[i, t, hit[0, 0]]) - sampled[i][t]) < 1e-5


class _WrongServer:
    """A loopback HTTP server answering like vLLM but with one logprob too few per row: the engine's
    own length check is under test here (a real vLLM server never does this)."""

    def __init__(self, tokenizer: Any) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # /v1/models
                self._send({"data": [{"id": "wrong"}]})

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    self._send(
                        {"tokens": tokenizer(request["prompt"], add_special_tokens=False)["input_ids"]}
                    )
                    return
                if self.path != "/v1/completions":  # like a vLLM server without --enable-scale-out
                    self.send_error(404)
                    return
                choices = [
                    {
                        "index": i,
                        "prompt_logprobs": [None]
                        + [{str(t): {"logprob": -1.0, "rank": 1}} for t in ids[1:-1]],
                    }
                    for i, ids in enumerate(request["prompt"])
                ]
                self._send({"choices": choices})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_length_mismatch_from_the_server_is_an_error_naming_url_and_row(tiny_zoo: Any) -> None:
    from transformers import AutoTokenizer

    fake = _WrongServer(AutoTokenizer.from_pretrained(str(tiny_zoo.teacher)))
    try:
        engine = ServerEngine.load(str(tiny_zoo.teacher), fake.url, ServerClientConfig(batch_size=2))
        assert not engine.tokens_route  # the probe's 404: scoring goes to /v1/completions
        prompts = [engine.prompt_ids(p) for p in ("a", "b", "c")]
        with pytest.raises(
            ServerError, match=rf"{fake.url}: row 0 has {len(prompts[0])} prompt \+ 2 completion"
        ):
            engine.score(prompts, [[5, 6], [7], [8, 9]])
    finally:
        fake.server.shutdown()
