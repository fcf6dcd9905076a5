"""`distill eval --domain dapo --benchmark ...`: protocol defaults, per-problem table, nested MLflow run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distill.evals.standalone import resolve_sampling

FIXTURE = Path(__file__).parents[1] / "domains" / "dapo" / "fixtures" / "matharena_hub"


def test_protocol_defaults_and_explicit_flags() -> None:
    ref = resolve_sampling(None, "aime25", None, None, None, None, None)
    assert (ref.k, ref.temperature, ref.top_p, ref.max_new_tokens, ref.enable_thinking) == (
        16,
        0.7,
        0.95,
        31744,
        True,
    )
    opsd = resolve_sampling("opsd", "aime25", None, None, None, None, None)
    assert (opsd.k, opsd.temperature, opsd.max_new_tokens, opsd.enable_thinking) == (12, 1.0, 38912, False)
    mine = resolve_sampling("reference", "aime25", 2, 0.0, 1.0, 8, False)
    assert (mine.k, mine.temperature, mine.top_p, mine.max_new_tokens, mine.enable_thinking) == (
        2,
        0.0,
        1.0,
        8,
        False,
    )
    # Without a benchmark or protocol: the embedded default's greedy, 64-token eval.
    plain = resolve_sampling(None, None, None, None, None, None, None)
    assert (plain.k, plain.temperature, plain.max_new_tokens, plain.enable_thinking) == (1, 0.0, 64, None)
    with pytest.raises(ValueError, match="unknown --protocol 'x'"):
        resolve_sampling("x", "aime25", None, None, None, None, None)


def _distill(args: list[str], workspace: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DISTILL_WORKSPACE=str(workspace), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.integration
def test_eval_benchmark_nested_under_training_run(tiny_zoo, tmp_path: Path) -> None:
    from distill.settings import Settings
    from distill.tracking.mlflow import open_tracker

    ws = tmp_path / "ws"
    ws.mkdir()
    settings = Settings(workspace=ws)
    parent = open_tracker(settings.resolved_tracking_uri, "distill", settings.artifact_root, run_name="train")
    parent.finish()
    run_dir = ws / "runs" / "r1"
    checkpoint = run_dir / "checkpoints" / "step-2"
    shutil.copytree(tiny_zoo.student, checkpoint)
    (run_dir / "summary.json").write_text(json.dumps({"mlflow_run_id": parent.run_id}))

    args = ["eval", "--domain", "dapo", "--benchmark", "aime25", "--data", str(FIXTURE)]
    proc = _distill([*args, "--model", str(checkpoint), "-n", "2", "--max-new-tokens", "8"], ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # The per-problem table (3 problems of the fixture) and the metric table.
    assert "aime25: per problem" in out and "aime25-3" in out and "/2" in out
    assert "avg@2" in out and "pass@2" in out and "solved" in out and "response_tokens_p90" in out
    assert "top_p 0.95" in out and "thinking True" in out and "nested under r1" in out

    from mlflow.tracking import MlflowClient

    client = MlflowClient(settings.resolved_tracking_uri)
    [child] = client.search_runs(
        [client.get_run(parent.run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.run_id}'",
    )
    assert child.data.tags["benchmark"] == "aime25" and child.data.tags["kind"] == "eval"
    assert child.data.params["k"] == "2" and child.data.params["protocol"] == "reference"
    assert child.data.metrics["eval/aime25/items"] == 3.0
    assert {"eval/aime25/avg_at_2", "eval/aime25/pass_at_2", "eval/aime25/truncation_rate"} <= set(
        child.data.metrics
    )
    assert [a.path for a in client.list_artifacts(child.info.run_id, "eval")]
    rows = (ws / "evals").glob("aime25-r1-step-2-k2-*.jsonl")
    [result] = [json.loads(line) for path in rows for line in path.read_text().splitlines()][:1]
    assert result["metrics"]["items"] == 3.0


@pytest.mark.integration
def test_eval_benchmark_bad_input(tiny_zoo, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    model = ["--model", str(tiny_zoo.student)]
    bad = _distill(["eval", "--domain", "rlve", "--benchmark", "aime25", *model], ws)
    assert bad.returncode != 0 and "use it with --domain dapo" in bad.stderr
    bad = _distill(["eval", "--domain", "dapo", "--data", str(FIXTURE), *model], ws)
    assert bad.returncode != 0 and "use it with --benchmark" in bad.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('[{"problem": "x"}]')
    bad = _distill(["eval", "--domain", "dapo", "--benchmark", "hmmt25", "--data", str(broken), *model], ws)
    assert bad.returncode != 0 and "broken.json: row 0: field 'answer' is missing" in bad.stderr
