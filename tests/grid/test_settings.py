"""The grid's SLURM settings: a `slurm:` section in a file, `slurm.KEY=VALUE` words on top, each
error one line naming the field, and what submitit is asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.config import ConfigError
from distill.grid.settings import is_setting, load_settings


def test_file_then_words(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(
        "slurm:\n  partition: gpu\n  time_min: 240\n  gpus_per_node: 8\n  mem_gb: 1.5\n"
        "  sbatch: ['--constraint=a100', '--exclusive']\n  setup: ['module load cuda']\n"
        "  launcher: accelerate\n"
    )
    slurm = load_settings(path, ["slurm.time_min=30", "slurm.nodes=2"]).slurm
    assert (slurm.partition, slurm.time_min, slurm.nodes, slurm.processes()) == ("gpu", 30, 2, 16)
    params = slurm.parameters()
    assert params["time"] == 30 and params["gpus_per_node"] == 8 and params["mem"] == "1536MB"
    assert params["additional_parameters"] == {"constraint": "a100", "exclusive": True}
    assert params["setup"] == ["module load cuda"] and "account" not in params
    # What submitit writes from them: the lines sbatch reads.
    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(command="true", folder=tmp_path, **params)
    for line in ("#SBATCH --constraint=a100", "#SBATCH --exclusive", "#SBATCH --gpus-per-node=8"):
        assert line in script
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --time=30" in script


@pytest.mark.parametrize(
    ("words", "field"),
    [
        (["slurm.time_min=0"], "slurm.time_min"),
        (["slurm.partiton=gpu"], "slurm.partiton"),
        (["slurm.nodes=2"], "a cell over several nodes needs launcher: accelerate"),
        (["slurm.sbatch=[constraint=a100]"], "'constraint=a100' is no sbatch option"),
        (["slurm.launcher=torchrun"], "slurm.launcher"),
    ],
)
def test_bad_settings_name_the_field(words: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, words)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_slurm_words_are_the_grids() -> None:
    assert is_setting("slurm.partition=gpu") and not is_setting("optim.lr=1") and not is_setting("sft:x=1")
