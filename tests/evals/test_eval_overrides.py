"""`distill eval` takes a config file's domain/eval sections and `domain.*` / `eval.*` overrides,
as `distill run` does: held-out environments, seeds and sizes from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from distill.config import ConfigError, dump_config, resolve_config
from distill.config.files import resolve_eval_config


def test_overrides_set_only_what_they_name() -> None:
    name, domain, ev = resolve_eval_config(None, None, ["domain.environments=[Division,LCM]", "eval.k=4"])
    assert name == "rlve" and domain == {"environments": ["Division", "LCM"]}
    assert ev == {"k": 4}  # the protocol's or the eval's defaults still fill the rest
    name, domain, ev = resolve_eval_config("dapo", None, ["domain.seed=3", "eval.temperature=0.6"])
    assert (name, domain, ev) == ("dapo", {"seed": 3}, {"temperature": 0.6})


def test_a_run_config_file_gives_its_domain_and_eval(tmp_path: Path) -> None:
    cfg = resolve_config(
        "rlve", "opd", overrides=["domain.eval_seed=11", "eval.max_new_tokens=32", "eval.every_steps=5"]
    )
    path = tmp_path / "config.yaml"
    dump_config(cfg, path)  # every field written out, as a run directory holds it
    name, domain, ev = resolve_eval_config(None, path, ["domain.eval_size=20"])
    assert name == "rlve" and domain["eval_seed"] == 11 and domain["eval_size"] == 20
    assert ev["max_new_tokens"] == 32 and "every_steps" not in ev and "eval_teacher" not in ev


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["optim.lr=1"], "override optim.lr: distill eval takes domain.* and eval.* overrides"),
        (["domain=1"], "override domain:"),
        (["domain.nope=1"], "domain.nope: Extra inputs are not permitted"),
        (["domain.eval_size=0"], "domain.eval_size"),
        (["eval.k=x"], "eval.k:"),
        (["eval.nope=1"], "eval.nope: Extra inputs"),
        (["eval.eval_teacher=false"], "eval.eval_teacher: applies to a training run's evals"),
        (["domain.eval_benchmark=aime25"], "use --benchmark"),
        (["domain.name=nope"], "use --domain"),
    ],
)
def test_bad_overrides_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_eval_config(None, None, overrides)
    assert needle in str(info.value)


def test_the_domain_option_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"domain": {"name": "rlve", "eval_size": 12}}))
    assert resolve_eval_config(None, path, [])[:2] == ("rlve", {"eval_size": 12})
    with pytest.raises(ConfigError, match="unknown domain 'nope'"):
        resolve_eval_config("nope", path, [])


@pytest.mark.integration
def test_eval_on_held_out_environments(tiny_zoo: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    env = {**os.environ, "DISTILL_WORKSPACE": str(ws), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("DISTILL_TRACKING_URI", None)
    args = [
        "eval",
        "--model",
        str(tiny_zoo.student),
        "domain.environments=[Division,LCM]",
        "domain.parameters={Division: {divisor_digit_num: 1, answer_digit_num: 1}, LCM: {MAX_a_b: 10}}",
        "domain.eval_seed=7",
        "domain.eval_size=6",
        "eval.max_new_tokens=8",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max_new_tokens 8" in proc.stdout and "6 items" in proc.stdout
    [out] = (ws / "evals").glob("rlve-*.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert sorted({row["id"].split("-")[0] for row in rows}) == ["Division", "LCM"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{(ws / 'mlflow.db').resolve()}")
    [run] = client.search_runs([client.get_experiment_by_name("distill").experiment_id])
    assert run.data.params["domain.environments"] == '["Division", "LCM"]'
    assert run.data.params["domain.eval_seed"] == "7" and run.data.params["max_new_tokens"] == "8"
