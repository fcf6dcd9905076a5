"""distill.launch without launching: the accelerate command line, flag checks, the shipped configs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from distill import launch

ACCELERATE_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
DEEPSPEED_MISSING = (
    "the accelerate config asks for DeepSpeed, which is not installed: "
    "pip install 'distill[sharded]' (deepspeed)"
)


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
    [
        ("cpu-ddp", "MULTI_GPU"),
        ("ddp", "MULTI_GPU"),
        ("zero3", "DEEPSPEED"),
        ("fsdp", "FSDP"),
        ("cpu-fsdp", "FSDP"),
        ("cpu-zero3", "DEEPSPEED"),
    ],
)
def test_shipped_configs_are_valid_accelerate_configs(name: str, kind: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
    assert cfg.distributed_type.value == kind
    # distill's precision is student.precision: no launcher-level autocast.
    assert str(cfg.mixed_precision) == "no"
    if name.endswith("zero3"):
        assert cfg.deepspeed_config["zero_stage"] == 3
    if name.endswith("fsdp"):
        assert cfg.fsdp_config["fsdp_version"] == 2
        assert cfg.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    if name.startswith("cpu-"):
        assert cfg.num_processes == 2 and cfg.main_process_port == 0  # a free port: tests run in parallel


def test_sharded_launchers_are_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not launch.sharded()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert launch.sharded()


def test_launch_plans_are_read_from_the_accelerate_configs() -> None:
    plan = launch.plan_of
    assert plan(ACCELERATE_CONFIGS / "cpu-fsdp.yaml", None) == launch.Plan("fsdp", 2)
    assert plan(ACCELERATE_CONFIGS / "cpu-zero3.yaml", None) == launch.Plan("zero3", 2)
    assert plan(ACCELERATE_CONFIGS / "fsdp.yaml", 4) == launch.Plan("fsdp", 4)  # the flag wins
    assert plan(ACCELERATE_CONFIGS / "cpu-ddp.yaml", 1) == launch.Plan("single", 1)
    assert plan(None, 2) == launch.Plan("ddp", 2) and plan(None, None) == launch.Plan("single", 1)


def test_launch_refusals_name_the_fields(tmp_path: Path) -> None:
    from distill.config import resolve_config

    fsdp, zero3 = launch.Plan("fsdp", 2), launch.Plan("zero3", 2)
    opd = resolve_config("rlve", "opd", None, ["rollout.prompts_per_step=4"])
    # ZeRO-3 needs DeepSpeed (distill[sharded], in `dev`): where it is missing, that one line.
    no_deepspeed = None if importlib.util.find_spec("deepspeed") else DEEPSPEED_MISSING
    # Every loss of the family trains sharded (no refusal left for forward_kl_topk, jsd, k1, k3).
    for loss in ("forward_kl_topk", "jsd", "k1", "k3", "token_reward_direct"):
        cfg = resolve_config("rlve", "opd", None, [f"method.loss={loss}"])
        assert launch.launch_refusal(cfg, fsdp) is None
        assert launch.launch_refusal(cfg, zero3) == no_deepspeed
    odd = resolve_config("rlve", "opd", None, ["rollout.prompts_per_step=3"])
    assert (
        launch.launch_refusal(odd, fsdp)
        == "rollout.prompts_per_step=3 is not divisible by the 2 training processes"
    )
    sft = resolve_config("rlve", "sft", None, ["optim.batch_size=5"])
    assert "optim.batch_size=5 is not divisible" in str(launch.launch_refusal(sft, fsdp))
    lora = resolve_config("rlve", "sft", None, ["lora.enabled=true"])
    assert "lora.enabled=true" in str(launch.launch_refusal(lora, fsdp))
    assert launch.launch_refusal(lora, launch.Plan("ddp", 2)) is None
    assert "fsdp_version=1" in str(launch.launch_refusal(opd, launch.Plan("fsdp1", 2)))
    moments = resolve_config(
        "rlve,dapo", "opd", None, ["domain.alternate=true", "domain.optimizer_state=per_domain"]
    )
    for plan in (fsdp,) if no_deepspeed else (fsdp, zero3, launch.Plan("deepspeed", 2)):
        assert str(launch.launch_refusal(moments, plan)).startswith("domain.optimizer_state=per_domain")
    assert launch.launch_refusal(moments, launch.Plan("ddp", 2)) is None
    # A sharded teacher needs an FSDP2 or ZeRO-3 launch (tests/test_teacher_shard.py: every line).
    shard = resolve_config(
        "rlve", "opd", None, ["teacher.shard=true", "rollout.async_teacher=false", "eval.eval_teacher=false"]
    )
    assert launch.launch_refusal(shard, fsdp) is None
    for plan in (launch.Plan("single", 1), launch.Plan("ddp", 2)):
        assert str(launch.launch_refusal(shard, plan)).startswith("teacher.shard=true splits the teacher")


def test_zero3_without_deepspeed_is_refused_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from distill.config import resolve_config

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # not importable, installed or not
    cfg = resolve_config("rlve", "opd", None, [])
    assert launch.launch_refusal(cfg, launch.Plan("zero3", 2)) == DEEPSPEED_MISSING
    assert launch.launch_refusal(cfg, launch.Plan("deepspeed", 2)) == DEEPSPEED_MISSING
    assert launch.launch_refusal(cfg, launch.Plan("fsdp", 2)) is None


def test_one_fsdp_process_without_cuda_is_one_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    config = ACCELERATE_CONFIGS / "cpu-fsdp.yaml"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # distill shards on CPU only over several processes: one trains unsharded, so an FSDP2
    # checkpoint of 2 processes is refused before the run directory changes, not failed in it.
    assert launch.plan_of(config, 1) == launch.Plan("single", 1)
    assert launch.plan_of(config, 2) == launch.Plan("fsdp", 2)
    step = tmp_path / "step-3"
    step.mkdir()
    (step / launch.LAUNCH_FILE).write_text('{"strategy": "fsdp", "processes": 2}')
    assert launch.resume_refusal(step, launch.plan_of(config, 1)) == (
        "step-3 was written by FSDP2 over 2 process(es); resume it with the same launcher "
        "(this launch: one process over 1)"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU: FSDP2 over it
    assert launch.plan_of(config, 1) == launch.Plan("fsdp", 1)


def test_resuming_under_another_launch(tmp_path: Path) -> None:
    step = tmp_path / "step-3"
    step.mkdir()
    assert launch.resume_refusal(step, launch.Plan("zero3", 4)) is None  # written before the record
    (step / launch.LAUNCH_FILE).write_text('{"strategy": "fsdp", "processes": 2}')
    # FSDP checkpoints are whole: any number of FSDP processes continues, and says so.
    assert launch.resume_refusal(step, launch.Plan("fsdp", 4)) is None
    assert "over 4 process(es) from step-3, written by 2" in str(
        launch.resume_note(step, launch.Plan("fsdp", 4))
    )
    assert launch.resume_note(step, launch.Plan("fsdp", 2)) is None
    # One process (or DDP) would read another optimizer file and start from fresh moments.
    assert "step-3 was written by FSDP2 over 2" in str(launch.resume_refusal(step, launch.Plan("single", 1)))
    (step / launch.LAUNCH_FILE).write_text('{"strategy": "zero3", "processes": 2}')
    assert launch.resume_refusal(step, launch.Plan("zero3", 2)) is None
    assert "and process count" in str(launch.resume_refusal(step, launch.Plan("zero3", 1)))
    (step / launch.LAUNCH_FILE).write_text('{"strategy": "ddp", "processes": 2}')
    assert launch.resume_refusal(step, launch.Plan("single", 1)) is None  # the same files
