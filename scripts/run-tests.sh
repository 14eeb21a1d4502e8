#!/usr/bin/env bash
# `make test`: the unit suite, the e2e suite on a real control plane, and checkov.
#
# The unit tests run one torch thread per process, one process per core. Meanwhile, in the
# background: the control plane's binaries are built (Go, `nice`d, cached in
# ~/.cache/octavo-e2e; nothing to do when cached), then the e2e suite runs against it (the
# API server, the operator, kwok and a few `octavo serve` pods: mostly waiting on timers
# and pods, little CPU), then checkov. OCTAVO_E2E_OVERLAP=0 runs the e2e suite after the
# unit suite instead (on a machine too small to hold both).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-.venv/bin}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
# Bytecode is written on first import (the venv is installed without it): with
# PYTHONDONTWRITEBYTECODE set, as on this workplace's machines, every one of the suite's
# hundreds of Python processes (servers, workers, pods) compiled the modules no earlier
# process had cached, ~2.4 s of CPU each for torch + transformers + the server from none.
unset PYTHONDONTWRITEBYTECODE
overlap="${OCTAVO_E2E_OVERLAP:-1}"
background_log=$(mktemp -t octavo-test-background.XXXXXX)
e2e_status=$(mktemp -t octavo-test-e2e.XXXXXX)

background_work() {
    "$BIN/python" -m e2e.cluster build || return $?
    if [ "$overlap" != "0" ]; then
        echo "== the e2e suite (beside the unit suite)"
        local e2e=0
        "$BIN/python" -m pytest -q e2e || e2e=$?
        echo "$e2e" >"$e2e_status"
    fi
    ./scripts/checkov.sh
}
export -f background_work
export BIN overlap e2e_status
setsid bash -c background_work >"$background_log" 2>&1 &
background=$!
stop_background() { kill -- "-$background" 2>/dev/null || true; }
trap stop_background EXIT

# Both cores (xdist): a file's tests stay on one worker (its module-scoped servers start
# once), the longest files first (tests/suite_timing.py); OCTAVO_TEST_WORKERS overrides.
# (GNU nproc answers OMP_NUM_THREADS when it is set: 1 here, so it is asked without it.)
workers="${OCTAVO_TEST_WORKERS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}"
if [ "$workers" -gt 4 ]; then workers=4; fi
# A crashed worker (killed for memory, say) ends the run at once, reported: xdist's
# replacement worker with --dist loadfile left the run waiting forever (seen once, idle
# for 30 minutes after an out-of-memory kill).
unit=0
"$BIN/python" -m pytest -q -n "$workers" --dist loadfile --max-worker-restart 0 || unit=$?

echo "== waiting for the control-plane build, the e2e suite beside the unit suite, and checkov"
status=0
wait "$background" || status=$?
trap - EXIT
cat "$background_log"
rm -f "$background_log"
if [ "$status" -ne 0 ]; then
    echo "the control-plane build or checkov failed (exit $status)" >&2
    exit "$status"
fi
e2e=0
if [ "$overlap" != "0" ]; then
    e2e=$(cat "$e2e_status")
else
    "$BIN/python" -m pytest -q e2e || e2e=$?
fi
rm -f "$e2e_status"
if [ "$unit" -ne 0 ]; then exit "$unit"; fi
exit "$e2e"
