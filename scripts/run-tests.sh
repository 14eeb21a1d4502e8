#!/usr/bin/env bash
# `make test`: the unit suite, the e2e suite on a real control plane, and checkov.
#
# The unit tests run one torch thread per process, one process per core; the control
# plane's binaries (Go, `nice`d, cached in ~/.cache/octavo-e2e) are built, and then checkov
# run, in the background meanwhile. The e2e suite starts once both are done; their output
# is printed then.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-.venv/bin}"
background_log=$(mktemp -t octavo-test-background.XXXXXX)

setsid bash -c "'$BIN/python' -m e2e.cluster build && ./scripts/checkov.sh" \
    >"$background_log" 2>&1 &
background=$!
stop_background() { kill -- "-$background" 2>/dev/null || true; }
trap stop_background EXIT

# Both cores (xdist): a file's tests stay on one worker (its module-scoped servers start
# once), the longest files first (tests/suite_timing.py); OCTAVO_TEST_WORKERS overrides.
workers="${OCTAVO_TEST_WORKERS:-$(nproc)}"
if [ "$workers" -gt 4 ]; then workers=4; fi
HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 \
    "$BIN/python" -m pytest -q -n "$workers" --dist loadfile

echo "== waiting for the control-plane build and checkov (started with the unit tests)"
status=0
wait "$background" || status=$?
trap - EXIT
cat "$background_log"
rm -f "$background_log"
if [ "$status" -ne 0 ]; then
    echo "the control-plane build or checkov failed (exit $status)" >&2
    exit "$status"
fi
"$BIN/python" -m pytest -q e2e
