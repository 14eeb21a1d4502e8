"""The multi-node layout on its own: which ranks each host runs, the flag checks made before
anything loads, and what each host decides from its own share (its CUDA device, its
shared memory, its GPUs and threads) rather than from the whole world's."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import SimpleNamespace

import pytest
import torch

from octavo import LLM
from octavo.cli import main
from octavo.config import EngineArgs
from octavo.distributed import worker_group
from octavo.distributed.node_layout import NodeLayout, node_role_problem
from octavo.distributed.parallel_config import ParallelConfig
from octavo.distributed.worker_group import Placement, join_process_group
from octavo.entrypoints import headless
from octavo.entrypoints.openai import server
from octavo.worker import worker as worker_module
from octavo.worker.host_overrides import HostOverrides
from octavo.worker.worker import STOP_WORKER, Worker
from octavo.worker.worker_process import serve

from serve_args import clean_environment  # noqa: F401 (an autouse fixture)


@pytest.mark.parametrize(
    ("tp", "pp", "nnodes", "blocks"),
    [
        (8, 2, 2, [range(0, 8), range(8, 16)]),  # TP in a node, PP across (vLLM's example)
        (4, 1, 2, [range(0, 2), range(2, 4)]),  # one TP group over two nodes
        (1, 3, 3, [range(0, 1), range(1, 2), range(2, 3)]),
        (2, 2, 1, [range(0, 4)]),
    ],
)
def test_each_node_holds_a_contiguous_block_of_ranks(tp, pp, nnodes, blocks):
    layout = NodeLayout(tp, pp, nnodes)
    assert [layout.ranks_on(node) for node in range(nnodes)] == blocks
    assert layout.problems() == []
    for node, block in enumerate(blocks):
        assert [layout.node_of(rank) for rank in block] == [node] * len(block)
        assert [layout.local_rank(rank) for rank in block] == list(range(len(block)))


def test_shared_memory_only_where_a_tensor_group_is_on_one_host():
    assert NodeLayout(8, 2, 2).tensor_group_is_local
    assert NodeLayout(2, 2, 1).tensor_group_is_local
    assert not NodeLayout(4, 1, 2).tensor_group_is_local
    assert not NodeLayout(2, 1, 2).tensor_group_is_local


def test_addresses():
    layout = NodeLayout(1, 2, 2, master_addr="10.0.0.5", master_port=29501)
    assert layout.control_address == ("10.0.0.5", 29501)
    assert layout.torch_init_method == "tcp://10.0.0.5:29502"
    assert layout.listen_host() == ""  # every interface: the workers resolve the address
    assert NodeLayout(master_addr="vllm-0.vllm.default").listen_host() == ""
    assert NodeLayout(master_addr="127.0.0.3").listen_host() == "127.0.0.3"
    assert NodeLayout(master_addr="::1", master_port=7).torch_init_method == "tcp://[::1]:8"
    assert layout.describe(1) == "node 1 (rank 1)"
    assert NodeLayout(8, 2, 2).describe(1) == "node 1 (ranks 8-15)"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"nnodes": 2, "node_rank": 2}, "--node-rank must be between 0 and 1 (--nnodes 2), got 2"),
        ({"nnodes": 3, "tensor_parallel_size": 2}, "--nnodes 3 must evenly divide the world"),
        (
            {"nnodes": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 3},
            "--nnodes 2 puts 3 ranks on each node: a node must hold whole tensor-parallel "
            "groups of 2 ranks",
        ),
        (
            {"nnodes": 2, "pipeline_parallel_size": 2, "master_port": 65535},
            "must be between 1 and 65534",
        ),
        ({"nnodes": 0}, "--nnodes must be >= 1"),
        ({"node_join_timeout": 0}, "--node-join-timeout must be > 0"),
    ],
)
def test_bad_multi_node_arguments_are_named(flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineArgs(model="unused", **flags)


def test_headless_goes_with_a_worker_hosts_node_rank_only():
    assert node_role_problem(False, 0, 2) is None and node_role_problem(True, 1, 2) is None
    assert "--headless runs a worker host: give it --node-rank 1..2" in node_role_problem(
        True, 0, 3
    )
    assert "--node-rank 1 is a worker host: start it with --headless" in node_role_problem(
        False, 1, 2
    )


PP2 = ["--pipeline-parallel-size", "2"]
BAD_COMBINATIONS = [
    ([*PP2, "--nnodes", "2", "--node-rank", "1"], "start it with --headless"),
    ([*PP2, "--nnodes", "2", "--headless"], "--headless runs a worker host"),
    ([*PP2, "--nnodes", "2", "--node-rank", "2", "--headless"], "between 0 and 1"),
    ([*PP2, "--nnodes", "3"], "must evenly divide"),
    (["--nnodes", "2"], "= 1 ranks"),
]
BAD_VALUES = [
    (["--nnodes", "2", "--node-rank", "-1"], "must be an integer >= 0"),
    (["--master-port", "70000"], "not a TCP port"),
    (["--node-join-timeout", "0"], "must be > 0"),
]


@pytest.fixture
def nothing_starts(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("started although the flags are wrong")

    monkeypatch.setattr(server, "run_server", must_not_run)
    monkeypatch.setattr(headless, "run_headless", must_not_run)


@pytest.mark.parametrize(("argv", "message"), BAD_COMBINATIONS)
def test_serve_refuses_bad_combinations_before_loading(
    argv, message, tiny_folder, capsys, nothing_starts
):
    assert main(["serve", str(tiny_folder("llama3")), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), BAD_VALUES)
def test_serve_refuses_bad_values(argv, message, tiny_folder, capsys, nothing_starts):
    with pytest.raises(SystemExit) as exited:
        main(["serve", str(tiny_folder("llama3")), *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_rank_takes_the_gpu_of_its_own_host(monkeypatch):
    """Rank 3 of tensor 2 × pipeline 2 over two nodes is the second GPU of node 1: cuda:1,
    never cuda:3 (which that host does not have)."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(worker_module, "join_process_group", lambda *args: None)

    def stop_loading(*args, **kwargs):
        raise LookupError("stop before loading")

    monkeypatch.setattr(worker_module, "load_model", stop_loading)
    loaded = {"folder": None, "config": None, "max_positions": 8, "dtype": None}
    spec = SimpleNamespace(
        device=torch.device("cuda"),
        seed=0,
        num_threads=None,
        quantization=None,
        load_format="auto",
        **loaded,
    )
    with pytest.raises(LookupError):
        Worker(spec, Placement(3, 2, 2, nnodes=2))
    assert chosen == [1]


def test_shared_memory_joins_only_a_tensor_group_on_one_host(monkeypatch):
    made: list[str] = []
    monkeypatch.setattr(worker_group, "open_store", lambda *a, **k: None)
    monkeypatch.setattr(worker_group.dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(worker_group.dist, "new_group", lambda ranks: tuple(ranks))
    monkeypatch.setattr(
        worker_group, "create_shared_all_reduce", lambda name, *args: made.append(name)
    )
    monkeypatch.setattr(worker_group, "set_parallel_state", lambda *args: None)
    join_process_group(Placement(1, 2, 1, nnodes=1), "", "gloo", "s")
    assert made == ["s-stage0"]
    join_process_group(Placement(1, 2, 1, nnodes=2), "", "gloo", "s")
    assert made == ["s-stage0"]  # the group spans two hosts: gloo's all-reduce


def test_gpus_are_counted_per_host(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    shape = SimpleNamespace(
        num_heads=16, num_kv_heads=8, intermediate_size=128, vocab_size=256, num_layers=4
    )
    cuda = torch.device("cuda")
    assert ParallelConfig(8, 2, nnodes=2).problems(shape, cuda) == []
    assert ParallelConfig(8, 2).problems(shape, cuda) == [
        "tensor_parallel_size × pipeline_parallel_size = 16 needs 16 GPUs, but 8 are visible"
    ]
    assert ParallelConfig(16, 1, nnodes=1).local_world_size == 16
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert ParallelConfig(8, 2, nnodes=2).problems(shape, cuda) == [
        "tensor_parallel_size × pipeline_parallel_size = 16 over 2 nodes needs 8 GPUs on each "
        "node, but 4 are visible here"
    ]


def test_a_worker_host_uses_its_own_model_folder_device_and_threads(tiny_folder, monkeypatch):
    monkeypatch.setattr("octavo.kernels.cpu_count.usable_cpus", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # `make test` sets it (to 1)
    sizes = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "nnodes": 2}
    args = EngineArgs(model=str(tiny_folder("llama3")), node_rank=1, **sizes)
    overrides = headless.host_overrides(args, NodeLayout.of(args))
    assert overrides == HostOverrides(str(tiny_folder("llama3")), "cpu", 8, None)
    assert HostOverrides.from_json(overrides.to_json()) == overrides
    leader_spec = LeaderSpec("/leader/only", torch.device("cuda", 3), 2, "/leader/tok", 5)
    mine = HostOverrides("/here/model", "cpu", 8, None).apply(leader_spec)
    assert (str(mine.folder), mine.device, mine.num_threads, mine.tokenizer, mine.seed) == (
        "/here/model",
        torch.device("cpu"),
        8,
        None,
        5,
    )


@dataclass
class LeaderSpec:
    """The fields of a ``WorkerConfig`` that matter here, as the leader sent them."""

    folder: str
    device: torch.device
    num_threads: int
    tokenizer: str | None
    seed: int


def test_a_worker_stopped_before_it_is_given_a_rank_exits_quietly():
    """The leader stops its own workers when its worker hosts never join: their first
    message is the stop, not their rank."""
    ours, theirs = socket.socketpair()
    leader, worker = Connection(ours.detach()), Connection(theirs.detach())
    leader.send(STOP_WORKER)
    assert serve(worker) is None
    leader.close()
    assert serve(worker) is None  # and the executor gone before any message


def test_an_engine_runs_on_the_leader_only(tiny_folder):
    with pytest.raises(ValueError, match="node_rank 1 is a worker host: run it as `octavo serve"):
        LLM(str(tiny_folder("llama3")), pipeline_parallel_size=2, nnodes=2, node_rank=1)
