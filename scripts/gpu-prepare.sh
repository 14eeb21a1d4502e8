#!/usr/bin/env bash
# Prepares, on this (CPU) machine, what scripts/gpu-check.sh needs on a lent GPU machine
# that has PyTorch and Triton but no network: wheels of the server's other dependencies
# for its Python (3.12) in .whl/ (`octavo serve`'s too, for the GPU bench's served part;
# prometheus-client, msgpack, pillow and rich are in the machine's image already), and a
# tokenizer-only stand-in of the embedded model in .gpu-baked/ (the GPU tests build tiny
# random models with its tokenizer; its weights are never read there and are too large to
# carry). Both folders are git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-.venv/bin}"
mkdir -p .whl .gpu-baked/SmolLM2-135M-Instruct
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
grep -qx '/.gpu-baked/' .git/info/exclude 2>/dev/null || echo /.gpu-baked/ >>.git/info/exclude
for package in fastapi starlette pydantic pydantic_core annotated-types typing-inspection \
    platformdirs gguf xgrammar apache-tvm-ffi uvicorn sniffio opentelemetry-api annotated-doc \
    transformers httpx httpcore h11 anyio idna certifi tqdm pyzmq openai-harmony; do
    version=$("$BIN/pip" show "$package" 2>/dev/null | awk '/^Version:/ {print $2}')
    "$BIN/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        "$package==$version"
done
"$BIN/python" - <<'PY'
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from octavo.model_executor.embedded import embedded_model_folder

source, target = embedded_model_folder(), Path(".gpu-baked/SmolLM2-135M-Instruct")
for name in ("config.json", "generation_config.json", "tokenizer.json",
             "tokenizer_config.json", "chat_template.jinja"):
    if (source / name).exists():
        shutil.copy(source / name, target / name)
save_file({"stand_in": torch.zeros(1)}, str(target / "model.safetensors"))
PY
du -sh .whl .gpu-baked
