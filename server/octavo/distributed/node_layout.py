"""Which ranks run on which host when one engine spans several (``--nnodes``).

The world of ``tensor_parallel_size × pipeline_parallel_size`` ranks is cut into
``nnodes`` contiguous blocks of ``local_world_size`` ranks, one per host: node ``R``
holds ranks ``[R*L, (R+1)*L)``. Ranks are laid out stage by stage with the tensor rank
fastest (``rank = stage * tp + tensor_rank``, as vLLM), so a block is either whole
tensor-parallel groups (tensor parallel inside a node, pipeline stages across nodes) or a
part of one group (a tensor-parallel group spread over ``tp / L`` nodes). Node 0 is the
leader: it runs the API server and the engine core, which drives every rank; the
others run ``octavo serve --headless``. The leader's control listener is
``master_addr:master_port``; torch.distributed meets at ``master_port + 1``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29501
DEFAULT_NODE_JOIN_TIMEOUT = 600.0  # seconds: worker hosts may still be pulling images
LAST_PORT = 65535


@dataclass(frozen=True)
class RankGrid:
    """How many ranks one engine has and how many run on each host."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nnodes: int = 1

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        """Ranks (GPUs) on each host."""
        return self.world_size // self.nnodes


@dataclass(frozen=True)
class NodeLayout(RankGrid):
    """The grid plus where this host sits in it and where the leader listens."""

    node_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT

    @classmethod
    def of(cls, args) -> NodeLayout:
        """The layout an ``EngineArgs`` asks for."""
        return cls(
            args.tensor_parallel_size,
            args.pipeline_parallel_size,
            args.nnodes,
            args.node_rank,
            args.master_addr,
            args.master_port,
        )

    @property
    def is_multi_node(self) -> bool:
        return self.nnodes > 1

    def ranks_on(self, node: int) -> range:
        local = self.local_world_size
        return range(node * local, (node + 1) * local)

    def node_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def local_rank(self, rank: int) -> int:
        """The rank's index on its own node (its GPU there)."""
        return rank % self.local_world_size

    @property
    def tensor_group_is_local(self) -> bool:
        """Whether every tensor-parallel group lies on one host (shared memory can join it)."""
        return self.local_world_size % self.tensor_parallel_size == 0

    @property
    def control_address(self) -> tuple[str, int]:
        """Where the leader's engine core listens for the worker hosts."""
        return self.master_addr, self.master_port

    @property
    def torch_init_method(self) -> str:
        """torch.distributed's rendezvous (rank 0, on the leader, hosts the store)."""
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port + 1}"

    def listen_host(self) -> str:
        """The leader's bind address: a loopback master address as it is (nothing outside
        this host may reach it), otherwise every interface (the master address is a name
        or an address of this host that the worker hosts resolve)."""
        try:
            loopback = ipaddress.ip_address(self.master_addr).is_loopback
        except ValueError:
            loopback = self.master_addr == "localhost"
        return self.master_addr if loopback else ""

    def describe(self, node: int) -> str:
        """``node 1 (ranks 2-3)``, for logs and errors."""
        return f"node {node} ({rank_span(self.ranks_on(node))})"

    def problems(self) -> list[str]:
        """What is wrong with these multi-node flags, as ``octavo serve`` flag names."""
        n, r, world = self.nnodes, self.node_rank, self.world_size
        tp = self.tensor_parallel_size
        found = []
        if not 0 <= r < n:
            found.append(f"--node-rank must be between 0 and {n - 1} (--nnodes {n}), got {r}")
        if world % n:
            found.append(
                f"--nnodes {n} must evenly divide the world size: tensor_parallel_size {tp} × "
                f"pipeline_parallel_size {self.pipeline_parallel_size} = {world} ranks"
            )
        elif (local := world // n) % tp and tp % local:
            found.append(
                f"--nnodes {n} puts {local} ranks on each node: a node must hold whole "
                f"tensor-parallel groups of {tp} ranks, or an equal share of one group "
                f"(tensor_parallel_size a multiple of the ranks per node); change "
                "--nnodes or the parallel sizes"
            )
        if not 1 <= self.master_port < LAST_PORT:
            found.append(
                f"--master-port {self.master_port}: torch.distributed meets at the next port "
                f"(master_port + 1), so it must be between 1 and {LAST_PORT - 1}"
            )
        return found


def rank_span(ranks: range) -> str:
    """``ranks 2-3`` (or ``rank 2``)."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def node_role_problem(headless: bool, node_rank: int, nnodes: int) -> str | None:
    """``--headless`` goes with a worker host's ``--node-rank`` (1..N-1), and only there."""
    if headless and node_rank == 0:
        return (
            "--headless runs a worker host: give it --node-rank 1.."
            f"{max(1, nnodes - 1)} with --nnodes; node 0 is the leader, which serves the API"
        )
    if not headless and node_rank > 0:
        return (
            f"--node-rank {node_rank} is a worker host: start it with --headless (only node 0, "
            "the leader, runs the API server)"
        )
    return None
