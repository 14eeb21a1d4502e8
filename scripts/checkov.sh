#!/usr/bin/env bash
# Static security checks with checkov on the Helm chart and the Dockerfile.
#
# checkov's dependencies conflict with the main .venv, so it lives in its own virtual
# environment, .venv-checkov (created here when missing). The helm framework renders the
# chart with `helm template`; without helm on PATH checkov silently checks nothing and
# exits 0, so this script refuses to run without helm. Suppressions live in .checkov.yaml
# (chart-wide, each with its reason) and in `checkov.io/skip*` annotations in the
# templates (per resource, each with its reason).
#
# Usage: scripts/checkov.sh            (HELM=/path/to/helm to pick a helm binary)
set -euo pipefail
cd "$(dirname "$0")/.."

CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
VENV=".venv-checkov"
PYTHON="${PYTHON:-python3}"

ensure_checkov() {
    if [ ! -x "$VENV/bin/checkov" ]; then
        "$PYTHON" -m venv "$VENV"
        # uv when `make venv` installed it (scripts/install-python.sh): its wheel cache.
        if [ -x .venv/bin/uv ] && UV_SYSTEM_CERTS=1 .venv/bin/uv pip install --quiet \
            --python "$VENV/bin/python" "checkov==$CHECKOV_VERSION"; then
            return
        fi
        "$VENV/bin/pip" install --quiet --upgrade pip
        "$VENV/bin/pip" install --quiet "checkov==$CHECKOV_VERSION"
    fi
}

find_helm() {
    if [ -n "${HELM:-}" ]; then
        echo "$HELM"
    elif command -v helm >/dev/null 2>&1; then
        command -v helm
    elif [ -x .venv/bin/python ]; then
        .venv/bin/python -c \
            'from e2e.cluster import build; print(build.ensure_built(("helm",))["helm"])'
    fi
}

# Runs checkov with the given arguments; fails unless it exits 0 and reports passed checks.
run_checkov() {
    local out
    out="$(mktemp)"
    set +e
    "$VENV/bin/checkov" --skip-download --compact --quiet "$@" >"$out" 2>&1
    local rc=$?
    set -e
    cat "$out"
    if [ "$rc" -ne 0 ]; then
        echo "checkov.sh: checkov $* exited $rc" >&2
        rm -f "$out"
        return "$rc"
    fi
    if ! grep -q "Passed checks: [1-9]" "$out"; then
        echo "checkov.sh: checkov $* reported no passed checks (nothing was scanned?)" >&2
        rm -f "$out"
        return 1
    fi
    rm -f "$out"
}

main() {
    local helm
    helm="$(find_helm)"
    if [ -z "$helm" ] || [ ! -x "$helm" ]; then
        echo "checkov.sh: helm not found (set HELM=, put helm on PATH, or build it with" \
            "'.venv/bin/python -m e2e.cluster build'); checkov would silently skip the chart" >&2
        exit 1
    fi
    ensure_checkov
    PATH="$(dirname "$helm"):$PATH"
    export PATH

    echo "== checkov: helm chart charts/octavo (helm: $helm)"
    run_checkov --framework helm -d charts/octavo --config-file charts/octavo/.checkov.yaml
    if [ -f Dockerfile ]; then
        echo "== checkov: Dockerfile"
        run_checkov --framework dockerfile -f Dockerfile
    else
        echo "checkov.sh: no Dockerfile yet; only the chart was checked" >&2
    fi
}

main "$@"
