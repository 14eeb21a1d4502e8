#!/usr/bin/env bash
# The GPU checks, run on a lent GPU machine (PyTorch and Triton installed, no network) by
# the device tool, after scripts/gpu-prepare.sh has filled .whl/ and .gpu-baked/ here:
#   carry [".whl", ".gpu-baked"], command "bash scripts/gpu-check.sh [TEST_FILE ...]"
# Runs the test files that have CUDA paths (default: every one that does), then, with no
# arguments, the GPU benchmark (`python -m octavo_bench gpu` on a random Llama-1B-shaped
# checkpoint: decode B=1 vs the HBM roofline, B=32 vs HF, Triton kernels vs torch), and
# writes the logs, gpu.json and gpu.png to $OUT when the device tool provides it.
# `make gpu-check` runs it; `make gpu-prepare` (on the CPU machine) fills .whl/.gpu-baked.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/server:$PWD/operator:$PWD/tests"
export OCTAVO_BAKED_MODELS="$PWD/.gpu-baked" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
benchmark=0
if [ "$#" -eq 0 ]; then
    set -- $(grep -l "cuda.is_available()" tests/test_*.py)
    benchmark=1
fi
out="${OUT:-/tmp}"
python3 -m pytest -q -p no:cacheprovider -o addopts="--durations=15" -rs "$@" 2>&1 |
    tee "$out/gpu-tests.log"
tests_status=${PIPESTATUS[0]}
if [ "$benchmark" -eq 1 ]; then
    python3 -m octavo_bench random-model llama-1b /tmp/octavo-llama-1b &&
        python3 -m octavo_bench gpu --model /tmp/octavo-llama-1b --output-dir "$out" 2>&1 |
        tee "$out/gpu-bench.log"
fi
exit "$tests_status"
