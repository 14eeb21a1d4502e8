"""One engine across "hosts": a leader `octavo serve` and `--headless` worker hosts as real
processes on 127.0.0.1, started with the multi-node flags.

Tensor parallel 2 across two nodes, pipeline parallel 2 across two nodes and pipeline
parallel 3 across three: greedy fp32 output token-identical to one process. Each group
then ends a different way: SIGTERM on the leader stops every host cleanly (exit 0); a
killed worker host turns the leader's /health 503 at once and the leader exits 2; a
killed leader makes every worker host exit 2 and leaves no worker process behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from multinode_cluster import NodeGroup, greedy_token_ids, node_group
from octavo import LLM, SamplingParams
from octavo.entrypoints.openai.server import ENGINE_DEATH_EXIT_CODE

from greedy_prompts import mixed_prompts
from tiny_models import build_tiny_model

STARTUP_SECONDS = 240
EXIT_WITHIN_SECONDS = 60
UNHEALTHY_WITHIN_SECONDS = 2.0  # the host's link is watched, not polled between steps
MAX_TOKENS = 12
PROMPTS = 4
SHARED_FLAGS = [
    "--dtype",
    "float32",
    "--max-model-len",
    "384",
    "--kv-cache-memory",
    "8MiB",
    "--num-threads",
    "1",
    "--return-tokens-as-token-ids",
]


@pytest.fixture(scope="module")
def prompts(smol_tokenizer) -> list[list[int]]:
    return mixed_prompts(smol_tokenizer)[:PROMPTS]


@pytest.fixture(scope="module")
def three_layer_folder(tmp_path_factory, smol_tokenizer):
    folder = tmp_path_factory.mktemp("llama3-3-layers")
    return build_tiny_model(folder, "llama3", smol_tokenizer, num_hidden_layers=3)


def one_process(folder, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(str(folder), dtype="float32", max_model_len=384, kv_cache_memory=8 << 20) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def served(group: NodeGroup, prompts: list[list[int]]) -> list[list[int]]:
    """The prompts' greedy completions, asked concurrently (they share steps)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: greedy_token_ids(group.url, p, MAX_TOKENS), prompts))


@contextlib.contextmanager
def started_group(folder, workdir, tensor: int, pipeline: int, nnodes: int):
    sizes = {
        "--tensor-parallel-size": tensor,
        "--pipeline-parallel-size": pipeline,
        "--nnodes": nnodes,
    }
    common = [*SHARED_FLAGS, *(text for item in sizes.items() for text in map(str, item))]
    with node_group(folder, workdir, common) as group:
        group.start_leader()
        for node in range(1, nnodes):
            group.start_worker(node)
        group.wait_healthy(STARTUP_SECONDS)
        yield group


def worker_processes(host_pid: int) -> list[psutil.Process]:
    return psutil.Process(host_pid).children(recursive=True)


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class TestTensorParallelAcrossTwoNodes:
    @pytest.fixture(scope="class")
    def group(self, tiny_folder, tmp_path_factory):
        workdir = tmp_path_factory.mktemp("tp2-nodes")
        with started_group(tiny_folder("llama3"), workdir, 2, 1, 2) as group:
            yield group

    def test_greedy_output_is_identical_to_one_process(self, group, tiny_folder, prompts):
        assert served(group, prompts) == one_process(tiny_folder("llama3"), prompts)
        leader_log = group.hosts[0].text()
        assert "node 1 joined from 127.0.0.1" in leader_log
        # rank 0 here, rank 1 on the other host: no shared memory between them
        assert "stage 0's tensor-parallel group spans hosts" in leader_log

    def test_sigterm_on_the_leader_stops_every_host_cleanly(self, group):
        leader, worker = group.hosts
        workers = worker_processes(worker.process.pid)
        assert len(workers) == 1
        os.kill(leader.process.pid, signal.SIGTERM)
        assert leader.wait(EXIT_WITHIN_SECONDS) == 0, group.logs()
        assert worker.wait(EXIT_WITHIN_SECONDS) == 0, group.logs()
        assert "the leader stopped the engine" in worker.text()
        assert all(gone(process) for process in workers)


class TestPipelineParallelAcrossTwoNodes:
    @pytest.fixture(scope="class")
    def group(self, tiny_folder, tmp_path_factory):
        workdir = tmp_path_factory.mktemp("pp2-nodes")
        with started_group(tiny_folder("llama3"), workdir, 1, 2, 2) as group:
            yield group

    def test_greedy_output_is_identical_to_one_process(self, group, tiny_folder, prompts):
        assert served(group, prompts) == one_process(tiny_folder("llama3"), prompts)

    def test_a_killed_worker_host_fails_health_at_once_and_the_leader_exits_2(self, group):
        leader, worker = group.hosts
        worker.kill_host()
        killed = time.monotonic()
        statuses: list[tuple[float, int]] = []
        while leader.process.poll() is None:
            assert time.monotonic() < killed + EXIT_WITHIN_SECONDS, group.logs()
            with contextlib.suppress(httpx.TransportError):  # already closing
                status = httpx.get(f"{group.url}/health", timeout=2).status_code
                statuses.append((time.monotonic() - killed, status))
            time.sleep(0.05)
        assert leader.process.returncode == ENGINE_DEATH_EXIT_CODE
        first_503 = next(seconds for seconds, status in statuses if status == 503)
        assert first_503 < UNHEALTHY_WITHIN_SECONDS, statuses
        assert all(status == 503 for seconds, status in statuses if seconds >= first_503)
        text = leader.text()
        assert "worker host 1 (127.0.0.1, rank 1) disconnected" in text
        assert "the engine core died" in text


class TestPipelineParallelAcrossThreeNodes:
    @pytest.fixture(scope="class")
    def group(self, three_layer_folder, tmp_path_factory):
        workdir = tmp_path_factory.mktemp("pp3-nodes")
        with started_group(three_layer_folder, workdir, 1, 3, 3) as group:
            yield group

    def test_greedy_output_is_identical_to_one_process(self, group, three_layer_folder, prompts):
        assert served(group, prompts) == one_process(three_layer_folder, prompts)

    def test_a_killed_leader_makes_every_worker_host_exit_2(self, group):
        leader, *hosts = group.hosts
        workers = [p for host in hosts for p in worker_processes(host.process.pid)]
        assert len(workers) == 2
        leader.kill_host()
        for host in hosts:
            assert host.wait(EXIT_WITHIN_SECONDS) == 2, group.logs()
            assert "the leader is gone" in host.text()
        deadline = time.monotonic() + 10
        while not all(gone(process) for process in workers):
            assert time.monotonic() < deadline, "worker processes left behind"
            time.sleep(0.05)
