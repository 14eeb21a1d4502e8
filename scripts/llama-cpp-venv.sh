#!/usr/bin/env bash
# Installs llama.cpp's Python bindings (llama-cpp-python, built from source for this CPU)
# into their own venv (default .venv-llamacpp), for the benchmarks' `llama.cpp` baseline
# (octavo_bench/llama_cpp_baseline.py runs llama_cpp_runner.py with this venv's python on
# the embedded model's GGUF). Never part of `make test`. Idempotent: a venv that already
# imports the pinned version, built with the same CMake flags, is left as it is.
#
#   scripts/llama-cpp-venv.sh [VENV_DIR]        # default .venv-llamacpp
#
# Environment:
#   PYTHON                      interpreter that creates the venv (default python3)
#   LLAMA_CPP_PYTHON_VERSION    the llama-cpp-python release (default: the pin below)
#   LLAMA_CPP_CMAKE_ARGS        CMake flags (default: native CPU build with OpenMP, no GPU,
#                               no AMX)
#
# llama-cpp-python ships as a source distribution only: pip compiles the vendored llama.cpp
# with CMake (about 4 minutes on 2 cores). GGML_NATIVE=ON builds for this CPU's
# instruction set (-march=native: AVX2/AVX-512 where present), so the venv does not travel
# to other machines. -U__AMX_INT8__ leaves out ggml's AMX backend, which -march=native
# would enable on AMX CPUs (Sapphire Rapids and later): in this release its batched
# matmul segfaults on the embedded SmolLM2 Q4_1 GGUF (any prompt of 2+ tokens; upstream
# ggml-org/llama.cpp#20824 reports the same crash in ggml_backend_amx_mul_mat), while
# decoding without it is correct. LLAVA_BUILD=OFF skips the multimodal library, which
# the baseline never loads (llama_cpp imports it lazily).
set -euo pipefail

VENV="${1:-.venv-llamacpp}"
PYTHON="${PYTHON:-python3}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEFAULT_CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF"
DEFAULT_CMAKE_ARGS+=" -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DLLAVA_BUILD=OFF"
DEFAULT_CMAKE_ARGS+=" -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__"
CMAKE_FLAGS="${LLAMA_CPP_CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS}"

say() { echo "llama-cpp-venv: $*"; }
die() { echo "llama-cpp-venv: ERROR: $*" >&2; exit 1; }

VPY="$VENV/bin/python"
VPIP=("$VPY" -m pip)
STAMP="$VENV/.llama-cpp-cmake-args" # the CMake flags of the installed build

llama_cpp_version() { # prints llama_cpp's version; fails when `import llama_cpp` does
    "$VPY" -c "import llama_cpp; print(llama_cpp.__version__)" 2>/dev/null | tail -n 1
    return "${PIPESTATUS[0]}"
}

# Step 0: the venv.
# shellcheck source=scripts/venv-lib.sh
. "$(dirname "$0")/venv-lib.sh"
ensure_venv

# Already done? (the idempotent fast path)
if version="$(llama_cpp_version)" && [ "$version" = "$VERSION" ] \
    && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$CMAKE_FLAGS" ]; then
    say "llama-cpp-python $VERSION already in $VENV (CMAKE_ARGS: $CMAKE_FLAGS); python: $VPY"
    exit 0
fi

# Step 1: the compilers the source build needs.
say "step 1/3: checking the build tools"
for tool in cmake cc c++; do
    command -v "$tool" >/dev/null 2>&1 || die "no $tool on PATH (install cmake and a C++ compiler)"
done
say "  $(cmake --version | head -n 1); $(c++ --version | head -n 1)"

# Step 2: build and install from source. --no-cache-dir: a wheel pip cached from other
# CMake flags must not be reused; --force-reinstall: rebuild when only the flags changed.
JOBS="$(nproc 2>/dev/null || echo 2)"
say "step 2/3: building llama-cpp-python==$VERSION from source with $JOBS jobs" \
    "(about 4 minutes on 2 cores)"
say "  CMAKE_ARGS: $CMAKE_FLAGS"
start="$(date +%s)"
rm -f "$STAMP"
CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" FORCE_CMAKE=1 \
    "${VPIP[@]}" install --verbose --no-cache-dir --force-reinstall \
    --no-binary llama-cpp-python "llama-cpp-python==$VERSION"
say "  built in $(($(date +%s) - start)) s"

# Step 3: verify.
say "step 3/3: checking import llama_cpp"
if ! version="$(llama_cpp_version)"; then
    "$VPY" -c "import llama_cpp" || true
    die "import llama_cpp failed in $VENV (see above)"
fi
[ "$version" = "$VERSION" ] || die "llama_cpp is $version, expected $VERSION"
echo "$CMAKE_FLAGS" >"$STAMP"
system_info="$("$VPY" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())')"
say "  system info: $system_info"
say "done: llama-cpp-python $VERSION in $VENV; python: $VPY"
