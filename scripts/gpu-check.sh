#!/usr/bin/env bash
# The GPU checks, run on a lent GPU machine (PyTorch, Triton and transformers installed, no
# network) by the device tool, after scripts/gpu-prepare.sh has filled .whl/ and .gpu-baked/:
#   carry [".whl", ".gpu-baked"], command "bash scripts/gpu-check.sh [TEST_FILE ...]"
# With no arguments: the fast GPU test files (decode graphs, the GPU bench's own tests, the
# Triton attention, activation, norm and rotary files, sampling on devices; not
# test_memory_profile.py, ~110 s: name it to run it) under `timeout 150`, then
# `python -m octavo_bench gpu` under `timeout 300` (CUDA graphs, graphs with torch's
# FlashAttention-2 in blocks of 256, graphs with --async-scheduling, and --enforce-eager,
# the slowest last: 1B
# decode B=1 vs the HBM roofline and B=32 vs B=1 and vs HF, nano-vllm's offline shape on the
# 1B and Qwen3-0.6B shapes, the 8B shape at B=1, Triton kernels vs torch, and the vLLM
# paper's comparison: `octavo serve` vs a naive HF server on ShareGPT-shaped Poisson
# arrivals, its report in /tmp/gpu-served: the device tool brings back 8 files, so its
# figures go to gpu.json and its table to the log; every model from a config-only folder
# with dummy weights, so no checkpoint is written), then `octavo_bench step-profile` of the
# 1B shape with steps in turn and with --async-scheduling alternating in one engine (host
# ms per phase vs GPU forward ms, batch 1/32/256 and nano-vllm's offline shape, and the
# calls per phase that made the host wait for the GPU). The tests leave out the bench's
# CPU run of its served part (the bench runs it on the GPU).
# With test files as arguments: those tests only, no benchmark.
# GPU_TESTS_TIMEOUT / GPU_BENCH_TIMEOUT (seconds, 150 / 300) bound the two parts, 0 leaves
# that part out; GPU_STEP_PROFILE=0 leaves the step profile out. A device call runs 600 s at
# most and the bench needs about 430 s (four modes and the served part), so a cold machine
# takes two calls: the bench first (GPU_TESTS_TIMEOUT=0 GPU_BENCH_TIMEOUT=540
# GPU_STEP_PROFILE=0), then the tests and the step profile (GPU_BENCH_TIMEOUT=0
# GPU_TESTS_TIMEOUT=300).
# Logs, gpu.json and gpu.png go to $OUT (the device tool's) or /tmp.
# `make gpu-check` runs it; `make gpu-prepare` (on the CPU machine) fills .whl/.gpu-baked.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD/server:$PWD/operator:$PWD/tests"
export OCTAVO_BAKED_MODELS="$PWD/.gpu-baked" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
benchmark=0
if [ "$#" -eq 0 ]; then
    # the GPU-relevant files first, the bench's own (CPU smoke runs included) last
    triton=$(grep -l "paged_decode_attention\|triton_kernels" tests/test_*.py |
        grep -v -e test_memory_profile.py -e test_cpu_kernels.py -e test_bench_gpu.py)
    set -- tests/test_decode_graphs.py tests/test_flash_attention_backend.py tests/test_piecewise_graphs.py tests/test_kernel_warm_up.py tests/test_async_scheduling.py tests/test_sampling_devices.py \
        tests/test_sampler_device_ops.py $triton tests/test_triton_activation.py \
        tests/test_triton_norm.py tests/test_triton_rotary.py tests/test_bench_gpu.py \
        --deselect tests/test_bench_gpu.py::test_the_served_part_launches_octavo_and_the_hf_server
    benchmark=1
fi
out="${OUT:-/tmp}"
tests_status=0
if [ "${GPU_TESTS_TIMEOUT:-150}" != 0 ]; then
    timeout "${GPU_TESTS_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -o addopts="--durations=15" -rs "$@" 2>&1 |
        tee "$out/gpu-tests.log"
    tests_status=${PIPESTATUS[0]}
fi
bench_status=0
if [ "$benchmark" -eq 1 ] && [ "${GPU_BENCH_TIMEOUT:-300}" != 0 ]; then
    timeout "${GPU_BENCH_TIMEOUT:-300}" python3 -m octavo_bench gpu --output-dir "$out" \
        --served-output-dir /tmp/gpu-served 2>&1 | tee "$out/gpu-bench.log"
    bench_status=${PIPESTATUS[0]}
fi
if [ "$benchmark" -eq 1 ] && [ "${GPU_STEP_PROFILE:-1}" = 1 ]; then
    # where a step's time goes (host phases vs the forward's GPU time), steps in turn and
    # with --async-scheduling, on the 1B shape with dummy weights
    python3 -m octavo_bench random-model llama-1b /tmp/octavo-1b-config --config-only
    # steps in turn and overlapped alternate in one engine (a lent VM's host speed drifts
    # by up to 2x between runs), two rounds each; nano-vllm's offline shape once per mode:
    # its prefill steps' median and longest GPU time tell kernels compiling mid-run (a few
    # long steps) from a slow prefill (all long)
    timeout 240 python3 -m octavo_bench step-profile --model /tmp/octavo-1b-config \
        --load-format dummy --batches 1,32,256 --steps 64 --compare-async --rounds 2 \
        --offline 256 --count-syncs --output-dir /tmp/profile 2>&1
    # the device tool brings back 8 files at most: the JSON alone (the table is logged)
    cp /tmp/profile/step_profile.json "$out/profile.json"
fi
echo "gpu-check: tests exit $tests_status (124: timed out), bench exit $bench_status"
[ "$tests_status" -eq 0 ] && exit "$bench_status"
exit "$tests_status"
