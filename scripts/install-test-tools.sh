#!/usr/bin/env bash
# Installs what the test suite needs besides Python packages: a real Prometheus server
# (tests/test_server_metrics.py points one at the OpenAI server and queries it) and
# headless Chromium (tests/test_web_ui.py drives the built-in web page in it).
# Idempotent: installs only what is missing. Debian/Ubuntu (apt).
set -euo pipefail

missing=()
if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
    missing+=(prometheus)
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    missing+=(chromium)
fi
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-tools: no apt-get here. Install ${missing[*]} yourself:" \
        "Prometheus (https://prometheus.io/download/) as \`prometheus\` on PATH, or set" \
        "OCTAVO_SKIP_PROMETHEUS=1 to skip its test; Chromium as \`chromium\` on PATH (or" \
        "OCTAVO_CHROMIUM=/path/to/chrome)." >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-test-tools: installing ${missing[*]} needs root (or sudo)." >&2
        exit 1
    fi
    SUDO="sudo"
fi

$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"

# The package may start its own daemon on :9090; the tests run their own instance.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $SUDO systemctl disable --now prometheus || true
fi

if command -v prometheus >/dev/null 2>&1; then
    prometheus --version 2>&1 | head -n 1
fi
if command -v chromium >/dev/null 2>&1; then
    chromium --version 2>&1 | head -n 1
fi
