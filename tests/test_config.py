"""distill.config: defaults, presets, layering, overrides, one-line errors; the CLI's error paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distill import __version__
from distill.config import (
    ConfigError,
    OPDMethod,
    RunConfig,
    SFTMethod,
    dump_config,
    flatten,
    load_run_config,
    preset_path,
    presets_dir,
    resolve_config,
)

# ---------------------------------------------------------------- schema and presets


def test_schema_defaults_validate() -> None:
    cfg = RunConfig()
    again = RunConfig.model_validate(cfg.model_dump())
    assert again == cfg
    assert cfg.domain.name == "rlve"
    assert isinstance(cfg.method, OPDMethod)
    assert cfg.method.coef == 1.0 and cfg.method.advantage_clip is None
    assert cfg.student.name == "zoo:student" and cfg.teacher.name == "zoo:teacher"
    assert cfg.optim.lr == 1e-4 and cfg.optim.max_steps == 100


def test_all_preset_files_resolve_and_their_values_win() -> None:
    # configs/accelerate/ holds launcher configs, not run presets.
    presets = sorted(p for p in presets_dir().glob("*/*.yaml") if p.parent.name != "accelerate")
    assert presets, "no presets found"
    for path in presets:
        domain, method = path.parent.name, path.stem
        cfg = resolve_config(domain, method)
        assert cfg.domain.name == domain and cfg.method.name == method
        resolved = flatten(cfg.model_dump(mode="json"))
        for key, value in flatten(yaml.safe_load(path.read_text())).items():
            assert resolved[key] == value, f"{path}: {key}"


def test_opd_preset_values() -> None:
    assert preset_path("rlve", "opd").exists()
    cfg = resolve_config("rlve", "opd")
    assert isinstance(cfg.method, OPDMethod)
    assert cfg.method.loss == "forward_kl_topk"  # schema default is token_reward_direct
    assert cfg.method.top_k == 32  # schema default is 20
    assert cfg.rollout.temperature == 0.3  # schema default is 1.0
    assert cfg.optim.lr == 1.2e-3  # schema default is 1e-4
    assert cfg.optim.scheduler == "cosine"  # schema default is constant
    assert cfg.optim.max_steps == 200  # schema default is 100
    assert cfg.checkpoint.every_steps == 50  # schema default is 25


def test_sft_preset_values() -> None:
    cfg = resolve_config("rlve", "sft")
    assert isinstance(cfg.method, SFTMethod)
    assert cfg.method.keep_verified_only is True
    assert cfg.optim.lr == 3e-4
    assert cfg.optim.max_steps == 200


def test_defaults_to_rlve_opd() -> None:
    cfg = resolve_config()
    assert cfg.domain.name == "rlve" and cfg.method.name == "opd"
    assert cfg.method.loss == "forward_kl_topk"


# ---------------------------------------------------------------- overrides and layering


def test_dotted_overrides_win_over_preset() -> None:
    cfg = resolve_config("rlve", "opd", overrides=["optim.lr=1e-5", "optim.max_steps=3", "method.coef=0.5"])
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.optim.max_steps == 3
    assert cfg.method.coef == 0.5
    # Untouched preset values survive.
    assert cfg.method.top_k == 32
    assert cfg.checkpoint.every_steps == 50


def test_new_key_into_existing_section_keeps_the_rest_of_it() -> None:
    cfg = resolve_config("rlve", "opd", overrides=["optim.weight_decay=0.1"])
    assert cfg.optim.weight_decay == 0.1
    assert cfg.optim.max_steps == 200  # the preset's optim section was merged into, not replaced


def test_nested_override_into_a_dict_field() -> None:
    cfg = resolve_config(
        "rlve", "opd", overrides=["domain.parameters.Sorting.N=5", "domain.parameters.Division.digit_num=2"]
    )
    assert cfg.domain.parameters["Sorting"] == {"N": 5}
    assert cfg.domain.parameters["Division"] == {"digit_num": 2}


def test_override_with_new_section_and_null() -> None:
    cfg = resolve_config("rlve", "opd", overrides=["tracking.run_name=abc", "method.advantage_clip=null"])
    assert cfg.tracking.run_name == "abc"
    assert cfg.method.advantage_clip is None


def test_later_override_wins() -> None:
    cfg = resolve_config("rlve", "opd", overrides=["optim.max_steps=3", "optim.max_steps=4"])
    assert cfg.optim.max_steps == 4


def test_config_file_between_preset_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "my.yaml"
    path.write_text("optim:\n  lr: 2.0e-4\n  max_steps: 7\nseed: 11\n")
    cfg = resolve_config("rlve", "opd", config_file=path, overrides=["optim.max_steps=3"])
    assert cfg.optim.lr == pytest.approx(2e-4)  # file beats preset
    assert cfg.optim.max_steps == 3  # override beats file
    assert cfg.seed == 11
    assert cfg.method.top_k == 32  # preset value not in the file survives


def test_config_file_names_the_method(tmp_path: Path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text("method:\n  name: sft\n  samples_per_prompt: 3\n")
    cfg = resolve_config(config_file=path)
    assert isinstance(cfg.method, SFTMethod)
    assert cfg.method.samples_per_prompt == 3
    assert cfg.optim.lr == pytest.approx(3e-4)  # the sft preset was loaded under the file


def test_empty_config_file_is_no_change(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert resolve_config("rlve", "opd", config_file=path) == resolve_config("rlve", "opd")


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    cfg = resolve_config("rlve", "sft", overrides=["optim.lr=1e-5", "domain.train_size=8"])
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_run_config(tmp_path / "config.yaml") == cfg


def test_load_run_config_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("optim:\n  lr: -1\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert str(path) in str(info.value) and "optim.lr" in str(info.value)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("overrides", "method", "field"),
    [
        (["optim.lrr=1"], "opd", "optim.lrr"),
        (["optim.lr=-1"], "opd", "optim.lr"),
        (["optim.lr=0"], "opd", "optim.lr"),
        (["optim.max_steps=abc"], "opd", "optim.max_steps"),
        (["optim.scheduler=bogus"], "opd", "optim.scheduler"),
        (["method.keep_verified_only=true"], "opd", "method.keep_verified_only"),
        (["method.coef=2"], "sft", "method.coef"),
        (["rollout.top_p=1.5"], "opd", "rollout.top_p"),
        (["nosuchsection.x=1"], "opd", "nosuchsection"),
    ],
)
def test_bad_override_names_the_field(overrides: list[str], method: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config("rlve", method, overrides=overrides)
    message = str(info.value)
    assert field in message
    assert "\n" not in message
    # The discriminator tag never leaks into the location.
    assert "method.opd" not in message and "method.sft" not in message


@pytest.mark.parametrize("text", ["optim", "=1", "optim.=1", ".lr=1", "optim..lr=1"])
def test_malformed_override(text: str) -> None:
    with pytest.raises(ConfigError, match="section.key=value"):
        resolve_config("rlve", "opd", overrides=[text])


def test_override_into_a_scalar_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"optim\.lr is not a section"):
        resolve_config("rlve", "opd", overrides=["optim.lr.x=1"])


def test_unknown_domain_and_method() -> None:
    with pytest.raises(ConfigError, match="unknown domain 'nope'.*rlve"):
        resolve_config("nope", "opd")
    with pytest.raises(ConfigError, match="unknown method 'nope'.*opd"):
        resolve_config("rlve", "nope")


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        resolve_config(config_file=missing)
    assert str(missing) in str(info.value)
    with pytest.raises(ConfigError, match="cannot read config file"):
        resolve_config(config_file=tmp_path)  # a directory


def test_invalid_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        resolve_config(config_file=path)
    assert str(path) in str(info.value)
    assert "line " in str(info.value)


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n"])
def test_top_level_non_mapping(tmp_path: Path, text: str) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="mapping at the top level") as info:
        resolve_config(config_file=path)
    assert str(path) in str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------- flatten


def test_flatten_nested() -> None:
    data = {
        "optim": {"lr": 1e-4, "sched": {"name": "cosine", "warm": 3}},
        "seed": 0,
        "empty": {},
        "xs": [1, 2],
    }
    assert flatten(data) == {
        "optim.lr": 1e-4,
        "optim.sched.name": "cosine",
        "optim.sched.warm": 3,
        "seed": 0,
        "empty": {},
        "xs": [1, 2],
    }
    assert flatten({}) == {}
    assert flatten({"a": {"b": 1}}, prefix="run.") == {"run.a.b": 1}


def test_flatten_of_a_run_config_has_dotted_keys() -> None:
    flat = flatten(resolve_config("rlve", "opd").model_dump(mode="json"))
    assert flat["optim.lr"] == 1.2e-3
    assert flat["method.loss"] == "forward_kl_topk"
    assert flat["domain.parameters.Sorting.N"] == 3
    assert not any(isinstance(v, dict) and v for v in flat.values())


# ---------------------------------------------------------------- CLI (subprocess)


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DISTILL_WORKSPACE=str(tmp_path / "ws"),
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        DVC_NO_ANALYTICS="1",
    )
    return env


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distill", *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def bad_files(tmp_path: Path) -> Path:
    (tmp_path / "bad.yaml").write_text("optim:\n  lr: [1,\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "optim.lrr=1"], "optim.lrr"),
        (["run", "optim.lr=-1"], "optim.lr"),
        (["run", "optim.max_steps=abc"], "optim.max_steps"),
        (["run", "method.keep_verified_only=true"], "method.keep_verified_only"),
        (["run", "--method", "sft", "method.coef=2"], "method.coef"),
        (["run", "--domain", "nope"], "unknown domain"),
        (["run", "--method", "nope"], "unknown method"),
        (["run", "--config", "missing.yaml"], "missing.yaml"),
        (["run", "--config", "bad.yaml"], "bad.yaml"),
        (["run", "--config", "list.yaml"], "list.yaml"),
        (["run", "optim"], "section.key=value"),
    ],
)
def test_cli_bad_input_exits_2_with_one_error_line(bad_files: Path, args: list[str], needle: str) -> None:
    proc = _cli(bad_files, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:")
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    # Config errors happen before anything is written to the workspace.
    assert not (bad_files / "ws" / "runs").exists()


def test_cli_resume_with_other_options_exits_2(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "run", "--resume", "abc", "--method", "sft")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--resume" in lines[0]


def test_cli_version(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"distill {__version__}"


def test_cli_help(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    for word in ("run", "eval", "runs", "zoo", "--version"):
        assert word in proc.stdout
    proc = _cli(tmp_path, "run", "--help")
    assert proc.returncode == 0
    assert "--config" in proc.stdout and "--method" in proc.stdout


def test_import_and_config_and_help_stay_light(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import distill.cli.app as app\n"
        "import distill.config as config\n"
        "config.resolve_config('rlve', 'opd', overrides=['optim.lr=1e-5'])\n"
        "try:\n"
        "    config.resolve_config('rlve', 'opd', overrides=['optim.lrr=1'])\n"
        "except config.ConfigError:\n"
        "    pass\n"
        "try:\n"
        "    app.app(['--help'], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'mlflow', 'datasets', 'accelerate') "
        "if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    heavy_line = [line for line in proc.stdout.splitlines() if line.startswith("HEAVY=")]
    assert heavy_line == ["HEAVY="], proc.stdout


# ---------------------------------------------------------------- opsd and the loss family


def test_opsd_teacher_is_the_student() -> None:
    cfg = resolve_config("rlve", "opsd", overrides=["student.name=zoo:teacher"])
    assert cfg.teacher.name == cfg.student.name == "zoo:teacher"
    assert cfg.method.name == "opsd" and cfg.method.teacher_weights == "base"
    assert cfg.eval.eval_teacher is False


def test_opsd_with_another_teacher_is_an_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="teacher.name=zoo:teacher but opsd's teacher is the student"):
        resolve_config("rlve", "opsd", overrides=["teacher.name=zoo:teacher"])


def test_opsd_honours_its_step0_copys_device_and_precision_and_refuses_what_it_cannot() -> None:
    """The frozen step-0 copy (teacher_weights=base) is a model of its own: teacher.device and
    teacher.precision apply to it, and it is placed as a teacher; the live student and the EMA
    teacher cannot sit elsewhere, and no other teacher field means anything: one line each."""
    from distill.prepare import model_devices

    cfg = resolve_config("rlve", "opsd", overrides=["teacher.device=cpu", "teacher.precision=bf16"])
    assert (cfg.teacher.device, cfg.teacher.precision) == ("cpu", "bf16")
    assert (cfg.student.device, cfg.student.precision) == ("auto", "fp32")
    assert cfg.teacher.name == cfg.student.name
    assert model_devices(cfg)["teacher.device"] == "cpu"
    # Saved and read back (a resume): the same teacher.
    assert RunConfig.model_validate(cfg.model_dump(mode="json")).teacher == cfg.teacher
    ema = resolve_config("rlve", "opsd", overrides=["method.teacher_weights=ema", "teacher.precision=bf16"])
    assert ema.teacher.precision == "bf16"
    refused = [
        (
            ["method.teacher_weights=live", "teacher.device=cpu"],
            "teacher.device=cpu: opsd's teacher is the student",
        ),
        (
            ["method.teacher_weights=live", "teacher.precision=bf16"],
            "with method.teacher_weights=live it has",
        ),
        (
            ["method.teacher_weights=ema", "teacher.device=cpu"],
            "with method.teacher_weights=ema it has the student's",
        ),
        (
            ["teacher.enable_thinking=true"],
            "teacher.enable_thinking=True: .* only teacher.device and teacher.precision",
        ),
    ]
    for overrides, message in refused:
        with pytest.raises(ConfigError, match=message) as info:
            resolve_config("rlve", "opsd", overrides=overrides)
        assert "\n" not in str(info.value)


def test_loss_family_is_validated() -> None:
    assert resolve_config("rlve", "opd", overrides=["method.loss=jsd", "method.beta=1"]).method.beta == 1.0
    with pytest.raises(ConfigError, match="method.loss"):
        resolve_config("rlve", "opd", overrides=["method.loss=k9"])
    with pytest.raises(ConfigError, match="method.beta"):
        resolve_config("rlve", "opd", overrides=["method.beta=1.5"])
    with pytest.raises(ConfigError, match="teacher_weights"):
        resolve_config("rlve", "opd", overrides=["method.teacher_weights=ema"])


def test_kernels_compile_reads_yaml_switches_and_refuses_others() -> None:
    # YAML reads `on`/`off` as booleans, in presets and in key=value overrides alike.
    assert resolve_config("rlve", "opd", overrides=["kernels.compile=on"]).kernels.compile == "on"
    assert resolve_config("rlve", "opd", overrides=["kernels.compile=off"]).kernels.compile == "off"
    assert resolve_config("rlve", "opd").kernels.compile == "auto"
    with pytest.raises(ConfigError, match="kernels.compile"):
        resolve_config("rlve", "opd", overrides=["kernels.compile=sometimes"])
