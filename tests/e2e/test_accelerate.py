"""`accelerate launch` with 2 CPU processes vs one process: same global batch, one run, one checkpoint.

The two-process run is `distill run --launcher accelerate --accelerate-config
configs/accelerate/cpu-ddp.yaml`, which re-execs as `accelerate launch --config_file ... -m distill
run ...` (accelerate's torchrun path; `accelerate launch --cpu --num_processes 2` starts ONE process
without mpirun, see the config's comment). Rollouts are near-greedy (temperature 1e-4) so both runs
sample the same completions for the same prompts, and their losses can be compared step by step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.test_run import _client, _env, _only_run, _overrides

pytestmark = pytest.mark.integration

CPU_DDP = Path(__file__).resolve().parents[2] / "configs" / "accelerate" / "cpu-ddp.yaml"
# Both runs see the same 8 sequences; the two-process loss is the mean of two half-batch losses
# normalised by the global token count (TRL's dapo loss), so only float summation order differs.
LOSS_TOLERANCE = 1e-5


def _args(tiny_zoo, loss: str) -> list[str]:
    return [
        "run",
        "--domain",
        "rlve",
        "--method",
        "opd",
        *_overrides(tiny_zoo, 3, 0),
        f"method.loss={loss}",
        "method.top_k=8",
        "rollout.temperature=1e-4",
        "eval.items=2",
        "eval.every_steps=2",  # rank 0 evaluates mid-run while rank 1 waits in the next step
        "eval.eval_teacher=false",
        "tracking.sample_rows=4",
    ]


def _run(cmd: list[str], workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=_env(workspace), capture_output=True, text=True, timeout=240)


def _train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


def _samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples" / "step-1.jsonl").read_text().splitlines()]


# TRL's GRPO loss, and a direct divergence whose student forward must go through the DDP wrapper.
@pytest.mark.parametrize("loss", ["token_reward_direct", "forward_kl_topk"])
def test_two_processes_train_like_one(tmp_path: Path, tiny_zoo, loss: str) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    single = _run([sys.executable, "-m", "distill", *_args(tiny_zoo, loss)], one)
    assert single.returncode == 0, single.stderr[-3000:]
    # `distill run --launcher accelerate` re-execs as `accelerate launch --config_file F -m distill run ...`.
    launcher = ["--launcher", "accelerate", "--accelerate-config", str(CPU_DDP)]
    multi = _run([sys.executable, "-m", "distill", *_args(tiny_zoo, loss), *launcher], two)
    assert multi.returncode == 0, multi.stderr[-3000:]

    run_one, run_two = _only_run(one), _only_run(two)  # exactly one run directory
    summary = json.loads((run_two / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["steps"] == 3
    assert multi.stdout.count("student  accuracy") == 1  # only rank 0 reports

    # Exactly one MLflow run, and it is the run directory's.
    client = _client(two)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [summary["mlflow_run_id"]]
    assert runs[0].info.status == "FINISHED"

    # One final checkpoint, committed after both ranks wrote their RNG state into it.
    checkpoints = sorted(p.name for p in (run_two / "checkpoints").iterdir() if p.is_dir())
    assert checkpoints == ["step-3"]
    final = run_two / "checkpoints" / "step-3"
    assert (final / "rng_state_0.pth").exists() and (final / "rng_state_1.pth").exists()
    assert (final / "model.safetensors").exists()

    # One metrics line per step (rank 1 writes none), and the same batch as the one-process run.
    rows_one, rows_two = _train_rows(run_one), _train_rows(run_two)
    evals = [r["step"] for r in map(json.loads, (run_two / "metrics.jsonl").read_text().splitlines())
             if "eval/rlve/accuracy" in r]  # fmt: skip
    assert evals == [0, 2, 3]
    assert [r["step"] for r in rows_two] == [1, 2, 3]
    assert [s["prompt"] for s in _samples(run_two)] == [s["prompt"] for s in _samples(run_one)[:4]]
    assert [s["student"] for s in _samples(run_two)] == [s["student"] for s in _samples(run_one)[:4]]
    assert rows_two[0]["train/loss"] == pytest.approx(rows_one[0]["train/loss"], abs=LOSS_TOLERANCE)
    # Steps 2 and 3 start from the updated weights: they match only if DDP averaged the gradients
    # to the one-process gradient (measured: |diff| <= 1.2e-7 on every step, both losses).
    for a, b in zip(rows_two, rows_one, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=LOSS_TOLERANCE)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    # Figures the method computes per rank are reduced over the ranks: the same as one process.
    for key in ("student/completion_tokens_mean", "student/completion_tokens_max"):
        assert rows_two[0][key] == pytest.approx(rows_one[0][key], abs=1e-4), key


def test_a_failing_process_fails_the_run_once(tmp_path: Path, tiny_zoo) -> None:
    # One teacher token can never be a verified trajectory: sft fails on whichever rank gets there
    # first, and torchrun stops the other; rank 0 must still mark the run FAILED, never RUNNING.
    args = [
        "run", "--domain", "rlve", "--method", "sft", *_overrides(tiny_zoo, 2, 0),
        "rollout.max_new_tokens=1", "eval.items=2", "eval.eval_teacher=false",
        "--launcher", "accelerate", "--accelerate-config", str(CPU_DDP),
    ]  # fmt: skip
    proc = _run([sys.executable, "-m", "distill", *args], tmp_path / "ws")
    assert proc.returncode != 0
    run_dir = _only_run(tmp_path / "ws")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FAILED"
    assert "no teacher trajectory passed the verifier" in summary["error"] or (
        summary["error"].startswith("LauncherStopped") and (run_dir / "error-rank1.log").exists()
    ), summary["error"]
    client = _client(tmp_path / "ws")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]
