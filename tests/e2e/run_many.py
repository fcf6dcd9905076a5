"""Several `distill run`s in one process, one after another: `python run_many.py SPEC.json`, or
`accelerate launch [...] run_many.py SPEC.json` for every rank of a multi-process launch.

SPEC.json is a list of `distill run` argument lists. Each run goes through distill's CLI and
runner exactly as `python -m distill run ...` (or `accelerate launch -m distill run ...`) would;
only the interpreter start-up (torch, transformers, TRL, DeepSpeed: most of a tiny run's time on
a 2-core machine) is shared. accelerate's and transformers' process-wide state (the accelerator
state, the active DeepSpeed config) is reset between runs, as a new process would start it.
A run's exit code is appended, one per line, to SPEC.json + ".codes" by rank 0, and its wall time
in seconds to SPEC.json + ".times".
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _fresh_process_state() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        import transformers.integrations.deepspeed as hf_deepspeed
    except ImportError:
        return
    hf_deepspeed.unset_hf_deepspeed_config()


def main(spec: Path) -> None:
    from distill import launch
    from distill.cli.app import app

    codes, times = Path(f"{spec}.codes"), Path(f"{spec}.times")
    for args in json.loads(spec.read_text()):
        _fresh_process_state()
        start = time.monotonic()
        try:
            code = app(args, standalone_mode=False)
        except SystemExit as exc:
            code = exc.code
        except Exception as exc:  # the CLI turns a run's failure into a line and a code; not this
            code = f"{type(exc).__name__}: {exc}"
        if launch.is_main_process():
            with codes.open("a") as fh:
                fh.write(f"{code or 0}\n")
            with times.open("a") as fh:
                fh.write(f"{time.monotonic() - start:.1f}\n")
        launch.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
