"""Several processes train like one: DDP, FSDP2 and DeepSpeed ZeRO-3 over 2 CPU processes (gloo)
against one process, run for run: per-step `train/loss` and `train/grad_norm` within 1e-5, the same
evaluations, one run directory and one MLflow run holding exactly metrics.jsonl, a `step-3`
checkpoint that loads with `from_pretrained` and holds every process's part.

The one-process runs are made once and shared by the three launchers; each launch runs its cases
one after another in the same processes (tests/e2e/run_many.py: the interpreter start-up is most
of a tiny run's time on a 2-core machine). Rollouts are near-greedy (temperature 1e-7: at 1e-4 a
near-tie of the tiny model's logits let the ranks' own sampling streams pick other tokens than
one process's) so both sides sample the same completions and their losses compare step by step.
The launches use configs/accelerate/cpu-ddp.yaml, cpu-fsdp.yaml and cpu-zero3.yaml as a user would.

A run costs up to a minute on 2 cores, so each launcher runs the cases its own code paths need
(LAUNCHES); DISTILL_E2E_FULL_MATRIX=1 runs every case under FSDP2 and ZeRO-3 (the table in
docs/scaling-multiprocess.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.test_run import _client, _env, _only_run, _overrides

from .mlflow_level import assert_level

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
RUN_MANY = Path(__file__).with_name("run_many.py")
STEPS = 3
# Both sides see the same sequences; only float summation order differs (measured: <= 6e-7).
TOLERANCE = 1e-5

CASES = {
    "sft": ["--method", "sft", "method.keep_verified_only=false"],
    # K drawn per sample from [0, 64] (the default range): each sample's own stream.
    "rose": ["--method", "rose", "method.teacher_max_tokens=16"],
    # Rank 0 evaluates mid-run while the others wait (on the gathered weights when sharded).
    "opd-fkl": ["--method", "opd", "method.loss=forward_kl_topk", "method.top_k=8", "eval.every_steps=2"],
    "opd-jsd": ["--method", "opd", "method.loss=jsd"],
    "opd-k1": ["--method", "opd", "method.loss=k1"],
    "opd-k3": ["--method", "opd", "method.loss=k3"],
    "opd-trd": ["--method", "opd", "method.loss=token_reward_direct"],
    "opsd-base": ["--method", "opsd", "method.teacher_weights=base"],
    "opsd-ema": ["--method", "opsd", "method.teacher_weights=ema"],
    "opsd-live": ["--method", "opsd", "method.teacher_weights=live"],
    # The teacher split over the processes (teacher.shard) scores in step on every rank, not in
    # its worker process: against one process scoring synchronously too.
    "opd-fkl-sync": ["--method", "opd", "method.loss=forward_kl_topk", "method.top_k=8", "eval.every_steps=2",
                     "rollout.async_teacher=false"],
    "opd-jsd-sync": ["--method", "opd", "method.loss=jsd", "rollout.async_teacher=false"],
}  # fmt: skip
# A sharded-teacher case: its arguments and the one-process run it must equal.
SHARDED_TEACHER = {"opd-fkl-tshard": "opd-fkl-sync", "opd-jsd-tshard": "opd-jsd-sync"}
CASES |= {case: [*CASES[same], "teacher.shard=true"] for case, same in SHARDED_TEACHER.items()}
# DDP: a direct divergence through the DDP wrapper. FSDP2: each method's path (sft/rose split
# batches, the head gathered once a pass, the EMA teacher shard by shard). ZeRO-3: TRL's loss and
# its other partitioning on the head and on the EMA teacher.
LAUNCHES = {
    "cpu-ddp.yaml": ["opd-fkl"],
    "cpu-fsdp.yaml": ["sft", "rose", "opd-fkl", "opd-jsd", "opsd-ema", "opd-fkl-tshard"],
    "cpu-zero3.yaml": ["opd-trd", "opsd-ema"],
}
if os.environ.get("DISTILL_E2E_FULL_MATRIX"):
    every = [c for c in CASES if c not in SHARDED_TEACHER.values()]
    LAUNCHES |= {"cpu-fsdp.yaml": every, "cpu-zero3.yaml": every}


def _same(case: str) -> str:
    """The one-process run `case` must equal (a sharded teacher's cannot run in one process)."""
    return SHARDED_TEACHER.get(case, case)


def _args(tiny_zoo, case: str) -> list[str]:
    models = _overrides(tiny_zoo, STEPS, 0)
    if case.startswith("opsd"):  # its teacher is the student's own weights
        models = [a for a in models if not a.startswith("teacher.name=")]
    return [
        "run", "--domain", "rlve", *CASES[case], *models,
        "rollout.temperature=1e-7", "eval.items=2", "eval.eval_teacher=false", "tracking.sample_rows=4",
        f"tracking.run_name={case}",
    ]  # fmt: skip


def _run_many(tiny_zoo, cases: list[str], workspace: Path, config: str | None) -> subprocess.CompletedProcess:
    workspace.mkdir(parents=True, exist_ok=True)
    spec = workspace / "spec.json"
    spec.write_text(json.dumps([_args(tiny_zoo, case) for case in cases]))
    cmd = [sys.executable, str(RUN_MANY), str(spec)]
    if config is not None:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(CONFIGS / config),
            *cmd[1:],
        ]
    proc = subprocess.run(cmd, env=_env(workspace), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    codes = (workspace / "spec.json.codes").read_text().split()
    assert codes == ["0"] * len(cases), (codes, proc.stderr[-4000:])
    return proc


@pytest.fixture(scope="module")
def one_process(tiny_zoo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case in one process: the runs each launcher is compared with."""
    workspace = tmp_path_factory.mktemp("one")
    wanted = {_same(case) for cases in LAUNCHES.values() for case in cases}
    _run_many(tiny_zoo, [c for c in CASES if c in wanted], workspace, None)
    return workspace


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _samples(run_dir: Path) -> list[dict]:
    path = run_dir / "samples" / "step-1.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _evals(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k.startswith("eval/")} | {"step": r["step"]}
        for r in rows
        if "eval/rlve/accuracy" in r
    ]


@pytest.mark.parametrize("config", list(LAUNCHES))
def test_processes_train_like_one(config: str, one_process: Path, tiny_zoo, tmp_path: Path) -> None:
    if config == "cpu-zero3.yaml":
        pytest.importorskip("deepspeed")
    cases = LAUNCHES[config]
    workspace = tmp_path / "launch"
    proc = _run_many(tiny_zoo, cases, workspace, config)
    assert proc.stdout.count("student  accuracy") == len(cases)  # only rank 0 reports, once a run
    client = _client(workspace)
    worst: dict[str, float] = {}
    teacher_bytes: dict[str, tuple[int, int]] = {}
    for case in cases:
        one, many = one_process / "runs" / _same(case), workspace / "runs" / case
        summary = json.loads((many / "summary.json").read_text())
        assert summary["status"] == "FINISHED" and summary["steps"] == STEPS, (case, summary.get("error"))
        assert_level(client, many)  # its one MLflow run holds exactly metrics.jsonl
        rows_one, rows_many = _rows(one), _rows(many)
        train_one = [r for r in rows_one if "train/loss" in r]
        train_many = [r for r in rows_many if "train/loss" in r]
        assert [r["step"] for r in train_many] == [1, 2, 3], case
        diffs = [
            abs(a[k] - b[k])
            for a, b in zip(train_one, train_many, strict=True)
            for k in ("train/loss", "train/grad_norm")
        ]
        worst[case] = max(diffs)
        assert worst[case] <= TOLERANCE, (case, train_one, train_many)
        assert _evals(rows_many) == _evals(rows_one), case  # the same evaluations, mid-run ones too
        # The same global batch: rank 0 writes the first process's samples, as one process does.
        shown_one, shown_many = _samples(one), _samples(many)
        assert [s.get("prompt") for s in shown_many] == [
            s.get("prompt") for s in shown_one[: len(shown_many)]
        ]
        final = many / "checkpoints" / f"step-{STEPS}"
        assert sorted(p.name for p in (many / "checkpoints").iterdir() if p.is_dir()) == [f"step-{STEPS}"]
        assert (final / "rng_state_0.pth").exists() and (final / "rng_state_1.pth").exists(), case
        assert json.loads((final / "distill_launch.json").read_text())["processes"] == 2
        if config == "cpu-zero3.yaml":  # ZeRO-3's optimizer state: one partition a process
            assert len(list(final.glob("global_step*/*optim_states.pt"))) == 2, case
        elif config == "cpu-fsdp.yaml":  # FSDP2's: whole, re-sharded on resume
            assert (final / "optimizer.bin").exists(), case
        if case == "opsd-ema":
            assert (final / "ema_teacher.safetensors").exists()
        if case in SHARDED_TEACHER:  # each rank holds half of the teacher's weights
            bytes_one, bytes_many = (_teacher_bytes(run) for run in (one, many))
            assert 0.5 <= bytes_many / bytes_one <= 0.55, (case, bytes_one, bytes_many)
            teacher_bytes[case] = (bytes_one, bytes_many)
    _checkpoint_loads(one_process / "runs" / cases[0], workspace / "runs" / cases[0])
    times = (workspace / "spec.json.times").read_text().split()
    print(
        f"{config}: max |difference| per case {worst}; seconds per run {dict(zip(cases, times, strict=True))}; "
        f"teacher parameter bytes, one process vs rank 0 of two: {teacher_bytes}"
    )


def _teacher_bytes(run_dir: Path) -> int:
    """The teacher's parameter bytes rank 0 held (the manifest's, from `HFEngine.describe`)."""
    return int(json.loads((run_dir / "manifest.json").read_text())["models"]["teacher"]["param_bytes"])


def _checkpoint_loads(one: Path, many: Path) -> None:
    """The sharded run's final checkpoint is a whole model `from_pretrained` loads, with the
    one-process run's weights (tied head and embedding included)."""
    import torch
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(one / "checkpoints" / f"step-{STEPS}", dtype=torch.float32)
    b = AutoModelForCausalLM.from_pretrained(many / "checkpoints" / f"step-{STEPS}", dtype=torch.float32)
    assert b.get_output_embeddings().weight is b.get_input_embeddings().weight
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(p, q, atol=1e-5), name


def test_a_failing_process_fails_the_run_once(tmp_path: Path, tiny_zoo) -> None:
    # One teacher token can never be a verified trajectory: sft fails on whichever rank gets there
    # first, and torchrun stops the other; rank 0 must still mark the run FAILED, never RUNNING.
    args = [
        "run", "--domain", "rlve", "--method", "sft", *_overrides(tiny_zoo, 2, 0),
        "rollout.max_new_tokens=1", "eval.items=2", "eval.eval_teacher=false",
        "--launcher", "accelerate", "--accelerate-config", str(CONFIGS / "cpu-ddp.yaml"),
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "distill", *args],
        env=_env(tmp_path / "ws"),
        capture_output=True,
        text=True,
        timeout=300,
    )
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
