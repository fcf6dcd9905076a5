# The two README commands: `make run` (install + the embedded default run) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export MLFLOW_DISABLE_TELEMETRY ?= true
export DVC_NO_ANALYTICS ?= 1
export OMP_WAIT_POLICY ?= PASSIVE

# vLLM runs in its own venv (it pins its own torch and transformers); the teacher-server tests
# (tests/engines/test_server_vllm.py) start a real `vllm serve` from it. `make test` builds it once
# per clone (scripts/vllm-env.sh: ~8 min and 3.5 GB on 2 busy cores, pip's cache cold or warm), so the
# test command runs the whole suite; VLLM=0 skips the build, and `make test` says up front which
# tests will skip and how to enable them. DISTILL_VLLM_VENV / DISTILL_VLLM_PYTHON point elsewhere.
VLLM ?= 1
VLLM_VENV ?= $(or $(DISTILL_VLLM_VENV),.venv-vllm)
VLLM_TESTS := the vLLM server tests (tests/engines/test_server_vllm.py)

# The SLURM tests (`pytest -m slurm`) run against a one-node cluster on this machine that they start
# and stop (scripts/slurm-local.sh); `make test` installs Debian's slurm-wlm and munge for them once
# (apt-get, root), and where that cannot be says up front that they will skip. SLURM=0 skips the install.
SLURM ?= 1
SLURM_TESTS := the SLURM tests (tests/e2e/test_grid_slurm.py)

.PHONY: install run test lint clean vllm-env vllm-for-tests slurm-for-tests

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

vllm-env:
	PYTHON=$(PYTHON) bash scripts/vllm-env.sh $(VLLM_VENV)

# Never fails the test run: a build that cannot finish (no network) leaves no half venv behind,
# and the line before the run says which tests will skip. A venv that already has vLLM is used
# as it is (the tests look for bin/vllm in it, as distill/engines/vllm_server.py does).
vllm-for-tests:
ifeq ($(VLLM),0)
	@echo "make test: VLLM=0: $(VLLM_TESTS) will skip; \`make vllm-env\` enables them"
else
	@if [ -z "$$DISTILL_VLLM_PYTHON" ] && [ ! -f "$(VLLM_VENV)/.installed" ] && [ ! -e "$(VLLM_VENV)/bin/vllm" ]; then \
	  echo "make test: building the vLLM environment $(VLLM_TESTS) need, once: $(VLLM_VENV)"; \
	  PYTHON=$(PYTHON) bash scripts/vllm-env.sh $(VLLM_VENV) || { rm -rf "$(VLLM_VENV)"; \
	    echo "make test: no vLLM environment: $(VLLM_TESTS) will skip; \`make vllm-env\` retries"; }; \
	fi
endif

slurm-for-tests:
ifeq ($(SLURM),0)
	@echo "make test: SLURM=0: $(SLURM_TESTS) will skip; \`scripts/slurm-local.sh install\` enables them"
else
	@if out=$$(bash scripts/slurm-local.sh install 2>&1); then \
	  echo "make test: SLURM installed: $(SLURM_TESTS) run on a one-node cluster they start and stop"; \
	else \
	  echo "make test: no SLURM ($$(echo "$$out" | tail -n 1)): $(SLURM_TESTS) will skip"; \
	fi
endif

# Two pytest workers (pytest-xdist), a test file each at a time: most of the suite's time is
# process start-up, waits on servers and one-thread runs, which a second worker overlaps on two
# cores. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
test: $(VENV)/.compiled vllm-for-tests slurm-for-tests
	HF_HUB_OFFLINE=1 DISTILL_VLLM_VENV=$(abspath $(VLLM_VENV)) $(BIN)/python -m pytest -q \
	  -n $(PYTEST_WORKERS) --dist loadfile --durations=25

lint: install
	$(BIN)/ruff check distill tests
	$(BIN)/mypy distill

clean:
	rm -rf $(VENV) workspace
