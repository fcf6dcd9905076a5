# The two README commands: `make run` (install + the embedded default run) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MLFLOW_DISABLE_TELEMETRY ?= true
export DVC_NO_ANALYTICS ?= 1
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install run test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned and by pip: pip takes the machine's own CPU build of it (uv does not
	# look there), and an unpinned torch pulls a multi-GB CUDA build on CPU machines.
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0 uv
	# The rest by uv, which keeps that torch: the install takes 64 s from a cold uv cache instead
	# of pip's 101 s, on 2 cores. uv does not byte-compile either.
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev]'
	touch $@

# The test suite starts hundreds of processes: where PYTHONDONTWRITEBYTECODE is set, each would
# compile torch, transformers, trl and mlflow in memory (26 s to import instead of 11 s), so the
# venv is byte-compiled once first, on every core (63 s; pip's file-by-file compile took 106 s).
# `make run` is one process: it pays the 15 s once rather than the 63 s. A file that does not
# compile (torch's Python 3.12-only test file) is skipped, as pip skips it.
$(VENV)/.compiled: $(VENV)/.installed
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $@

# Python's own default, even where PYTHONDONTWRITEBYTECODE is set (this machine): the run's first
# imports leave their bytecode, so the teacher's worker process (rollout.async_teacher) starts in
# ~9 s instead of ~30 s, and so does every later command.
run: install
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/distill run --domain rlve --method opd

test: $(VENV)/.compiled
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check distill tests
	$(BIN)/mypy distill

clean:
	rm -rf $(VENV) workspace
