"""distill.launch without launching: the accelerate command line, flag checks, the shipped configs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distill import launch

ACCELERATE_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "accelerate"


def test_launcher_flags_are_stripped_in_both_spellings() -> None:
    args = [
        "run", "--domain", "rlve", "--launcher", "accelerate", "--accelerate-config=x.yaml",
        "--num-processes", "2", "optim.max_steps=3",
    ]  # fmt: skip
    assert launch.strip_launcher_flags(args) == ["run", "--domain", "rlve", "optim.max_steps=3"]


def test_accelerate_argv_with_a_config_file() -> None:
    cfg = ACCELERATE_CONFIGS / "cpu-ddp.yaml"
    argv = launch.accelerate_argv(["run", "--launcher", "accelerate", "optim.lr=1e-5"], cfg, None)
    assert argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert argv[3:5] == ["--config_file", str(cfg)]
    # `accelerate launch ... -m distill run ...`: the documented hand-typed form, minus our flags.
    assert argv[5:] == ["-m", "distill", "run", "optim.lr=1e-5"]


def test_accelerate_argv_with_only_a_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_default_config_exists", lambda: False)
    argv = launch.accelerate_argv(["run"], None, 2)
    i = argv.index("--num_processes")
    assert argv[i + 1] == "2"
    # More than one process takes accelerate's torchrun path (the one that works on CPU hosts too).
    assert "--multi_gpu" in argv and argv[-3:] == ["-m", "distill", "run"]
    assert "--multi_gpu" not in launch.accelerate_argv(["run"], None, 1)


def test_missing_config_file_is_named() -> None:
    with pytest.raises(ValueError, match="--accelerate-config: no such file .*nope.yaml"):
        launch.accelerate_argv(["run"], Path("nope.yaml"), None)


@pytest.mark.parametrize(
    ("launcher", "kwargs", "message"),
    [
        (None, {"num_processes": 2}, "go with --launcher accelerate"),
        ("torchrun", {}, "the only launcher is 'accelerate'"),
        ("accelerate", {"preflight": True}, "drop --launcher"),
        ("accelerate", {"num_processes": 0}, "at least 1"),
    ],
)
def test_bad_launcher_requests_fail_before_launching(launcher, kwargs, message) -> None:
    options = {"config_file": None, "num_processes": None, "preflight": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        launch.exec_accelerate(launcher, ["run"], **options)


def test_no_relaunch_from_inside_a_launched_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="already running under a launcher"):
        launch.exec_accelerate("accelerate", ["run"], None, 2)


def test_cli_reports_a_bad_launcher_with_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "distill", "run", "--launcher", "slurm", "optim.max_steps=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "error: --launcher 'slurm': the only launcher is 'accelerate'" in proc.stderr


def test_ranks_and_per_device_batch_from_the_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launch.world_size() == 1 and launch.is_main_process()
    assert launch.per_device(8, "rollout.prompts_per_step") == 8
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not launch.is_main_process()
    assert launch.per_device(8, "rollout.prompts_per_step") == 4
    with pytest.raises(ValueError, match="rollout.prompts_per_step=3 is not divisible by the 2"):
        launch.per_device(3, "rollout.prompts_per_step")


def test_single_process_agreement_is_the_identity() -> None:
    # No process group: share/reduce/barrier are no-ops, so one-process runs are unchanged.
    assert launch.broadcast(("a", None)) == ("a", None)
    assert launch.reduce_metrics({"x": 1.0}) == {"x": 1.0}
    launch.barrier()


@pytest.mark.parametrize(
    ("name", "kind"),
    [("cpu-ddp", "MULTI_GPU"), ("ddp", "MULTI_GPU"), ("zero3", "DEEPSPEED"), ("fsdp", "FSDP")],
)
def test_shipped_configs_are_valid_accelerate_configs(name: str, kind: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
    assert cfg.distributed_type.value == kind
    # distill's precision is student.precision: no launcher-level autocast.
    assert str(cfg.mixed_precision) == "no"
    if name == "zero3":
        assert cfg.deepspeed_config["zero_stage"] == 3
    if name == "fsdp":
        assert cfg.fsdp_config["fsdp_version"] == 2
        assert cfg.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    if name == "cpu-ddp":
        assert cfg.num_processes == 2 and cfg.main_process_port == 0  # a free port: tests run in parallel


def test_sharded_launchers_are_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not launch.sharded()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert launch.sharded()


@pytest.mark.parametrize("loss", ["forward_kl_topk", "jsd", "k3"])
def test_divergence_losses_refuse_a_sharded_student(monkeypatch: pytest.MonkeyPatch, loss: str) -> None:
    from distill.config import OPDMethod, RunConfig
    from distill.methods.batch import TeacherSide
    from distill.methods.context import RunContext
    from distill.methods.on_policy import train_on_policy
    from distill.methods.views import plain_prompt
    from distill.tracking.rundir import RunDir

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    # Refused before the domain, the engines or the log are touched: none is needed.
    ctx = RunContext(RunConfig(method=OPDMethod(loss=loss)), RunDir(Path(".")), None, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"method.loss={loss} trains in several processes with DDP only"):
        train_on_policy(ctx, {"rlve": TeacherSide(None, plain_prompt)})  # type: ignore[arg-type]
