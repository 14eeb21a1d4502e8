#!/usr/bin/env bash
# The GPU checks, run on a lent GPU machine (PyTorch and Triton installed, no network) by
# the device tool, after scripts/gpu-prepare.sh has filled .whl/ and .gpu-baked/ here:
#   carry [".whl", ".gpu-baked"], command "bash scripts/gpu-check.sh [TEST_FILE ...]"
# Runs the test files that have CUDA paths (default: every one that does) and writes the
# log to $OUT when the device tool provides it.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/server:$PWD/operator:$PWD/tests"
export OCTAVO_BAKED_MODELS="$PWD/.gpu-baked" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
if [ "$#" -eq 0 ]; then
    set -- $(grep -l "cuda.is_available()" tests/test_*.py)
fi
log="${OUT:-/tmp}/gpu-tests.log"
python3 -m pytest -q -p no:cacheprovider -o addopts="--durations=15" -rs "$@" 2>&1 | tee "$log"
