"""The node channel in one process, without a model: the leader's rendezvous on a free
loopback port and worker hosts played by ``connect_to_leader``.

Hosts that join are handed over as connections the executor drives like local pipes, and
a NodeWatch reports a host's worker exit or its link's end; a host with other parallel
sizes, or a second host claiming one node rank, is refused on both sides; a peer without
the key (or one that speaks garbage) is turned away while the wait goes on, logged, until
it fails naming the missing host; a worker host whose leader never answers gives up.
Handshakes run side by side under one deadline each: silent, garbled and trickling
strangers do not delay a real host's join, and a malformed handshake (even from a peer
holding the key) drops only that connection. Without ``OCTAVO_NODE_KEY`` neither a leader
nor a worker host starts."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import re
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

import pytest

from octavo.cli import main
from octavo.config import EngineArgs
from octavo.distributed.node_layout import NodeLayout
from octavo.entrypoints import headless
from octavo.entrypoints.llm import LLM
from octavo.entrypoints.openai import server
from octavo.executor import node_admission, node_rendezvous
from octavo.executor.node_channel import (
    KEY_ENV,
    NODE_LINK,
    RANK_LINK,
    STOP_NODE,
    WORKER_EXITED,
    NodeChannelError,
    NodeKeyMissing,
    NodeRefused,
    connect_to_leader,
    hello,
)
from octavo.executor.node_rendezvous import NodeRendezvous, WorkersDidNotJoin
from octavo.executor.node_watch import NodeWatch

from multinode_cluster import free_port_pair

WAIT = 30.0
KEY = "channel-test"
NO_KEY = f"{KEY_ENV} is not set: a multi-node engine (--nnodes > 1) needs the same secret"


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(1) as executor:
        yield executor


def leader_layout(tp: int = 1, pp: int = 2, nnodes: int = 2) -> NodeLayout:
    return NodeLayout(tp, pp, nnodes, master_addr="127.0.0.1", master_port=free_port_pair())


def gather(pool: ThreadPoolExecutor, layout: NodeLayout, timeout: float = WAIT) -> Future:
    """The leader's rendezvous, running (the hosts retry until it listens)."""
    return pool.submit(NodeRendezvous(layout, timeout).gather)


def connect_raw(layout: NodeLayout) -> socket.socket:
    """A plain TCP connection to the leader, once it listens."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return socket.create_connection(layout.control_address)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def join(layout: NodeLayout, node: int, timeout: float = WAIT):
    """Node ``node``'s link and rank connections, as its agent opens them."""
    host = dataclasses.replace(layout, node_rank=node)
    deadline = time.monotonic() + timeout
    link = connect_to_leader(host, hello(host, NODE_LINK), deadline)
    ranks = [
        connect_to_leader(host, hello(host, RANK_LINK, rank), deadline)
        for rank in host.ranks_on(node)
    ]
    return link, ranks


def test_hosts_join_and_their_losses_are_watched(pool):
    layout = leader_layout(pp=3, nnodes=3)
    future = gather(pool, layout)
    hosts = {node: join(layout, node) for node in (1, 2)}
    joined = future.result(WAIT)
    assert [(link.node, link.ranks) for link in joined.links] == [
        (1, range(1, 2)),
        (2, range(2, 3)),
    ]
    assert [(worker.rank, worker.node) for worker in joined.workers] == [(1, 1), (2, 2)]
    # a remote rank is a connection like a local pipe: calls one way, answers the other
    joined.workers[0].conn.send(("execute_model", ()))
    assert hosts[1][1][0].recv() == ("execute_model", ())
    hosts[1][1][0].send(("ok", 7))
    assert joined.workers[0].conn.recv() == ("ok", 7)

    losses: queue.Queue[str] = queue.Queue()
    NodeWatch(joined.links[1:]).on_loss(losses.put)
    hosts[2][0].send((WORKER_EXITED, 2, -9))
    assert (
        losses.get(timeout=WAIT)
        == "worker 2 on worker host 2 (127.0.0.1, rank 2) exited with code -9"
    )
    NodeWatch(joined.links[:1]).on_loss(losses.put)
    hosts[1][0].close()
    assert losses.get(timeout=WAIT) == "worker host 1 (127.0.0.1, rank 1) disconnected"
    quiet = NodeWatch(joined.links[1:])
    quiet.stop()  # a clean stop: the link's end is not a loss
    joined.links[1].stop()
    assert hosts[2][0].recv() == STOP_NODE
    assert quiet.lost is None


def test_a_host_with_other_parallel_sizes_is_refused_on_both_sides(pool):
    layout = leader_layout(tp=2, pp=1)
    future = gather(pool, layout)
    message = (
        "node 1 (127.0.0.1) was started with --tensor-parallel-size 1, the leader with "
        "--tensor-parallel-size 2"
    )
    with pytest.raises(NodeRefused, match=re.escape(f"the leader refused this host: {message}")):
        join(dataclasses.replace(layout, tensor_parallel_size=1, pipeline_parallel_size=2), 1)
    with pytest.raises(NodeRefused, match=re.escape(message)):
        future.result(WAIT)


def test_two_hosts_claiming_one_node_rank_are_refused(pool):
    layout = leader_layout(pp=3, nnodes=3)
    future = gather(pool, layout)
    link, _ = join(layout, 1)
    with pytest.raises(NodeRefused, match="node 1 joined twice"):
        join(layout, 1)
    with pytest.raises(NodeRefused, match="each worker host needs its own --node-rank"):
        future.result(WAIT)
    assert link.recv()[0] == "abort"  # the host that had joined is told the load failed


def test_strangers_are_turned_away_and_the_wait_ends_naming_the_missing_host(
    pool, monkeypatch, caplog
):
    monkeypatch.setattr(node_rendezvous, "PROGRESS_LOG_SECONDS", 0.3)
    layout = leader_layout()
    caplog.set_level(logging.INFO, logger="octavo.executor.node_rendezvous")
    future = gather(pool, layout, timeout=2.0)
    with connect_raw(layout) as stranger:
        stranger.sendall(b"GET / HTTP/1.1\r\n\r\n")  # not a worker host at all
    monkeypatch.setenv(KEY_ENV, "another-secret")
    with pytest.raises(NodeChannelError, match=f"set the same {KEY_ENV} on every node"):
        join(layout, 1)
    message = (
        f"worker host(s) node 1 (rank 1) did not join 127.0.0.1:{layout.master_port} within "
        "2 s (--node-join-timeout)"
    )
    with pytest.raises(WorkersDidNotJoin, match=re.escape(message)):
        future.result(WAIT)
    logged = caplog.text
    assert "waiting for node 1 (rank 1) on 127.0.0.1" in logged
    assert "still waiting for node 1 (rank 1): not connected, 0 of 1 workers connected" in logged
    assert f"it does not hold this engine's {KEY_ENV}" in logged
    assert "ignored a connection from 127.0.0.1" in logged


def test_a_worker_host_gives_up_when_the_leader_never_answers():
    layout = dataclasses.replace(leader_layout(), node_rank=1)
    started = time.monotonic()
    message = r"127\.0\.0\.1:\d+ did not answer within \d s \(last error: ConnectionRefused"
    with pytest.raises(NodeChannelError, match=message):
        connect_to_leader(layout, hello(layout, NODE_LINK), time.monotonic() + 1.5)
    assert time.monotonic() - started < 5


def silent_stranger(layout: NodeLayout) -> socket.socket:
    """Connects and says nothing."""
    return connect_raw(layout)


def garbage_stranger(layout: NodeLayout) -> socket.socket:
    """Announces a 5-byte message, sends 3 bytes of it, and stalls."""
    stranger = connect_raw(layout)
    stranger.sendall(b"\x00\x00\x00\x05hel")
    return stranger


def slowloris(layout: NodeLayout, stop: threading.Event) -> threading.Thread:
    """Announces a 255-byte message and sends it one byte every 50 ms (each read is quick,
    the handshake never ends) until the leader cuts it or ``stop`` is set."""
    stranger = connect_raw(layout)

    def trickle() -> None:
        with stranger, contextlib.suppress(OSError):
            stranger.sendall(b"\x00\x00\x00\xff")
            while not stop.wait(0.05):
                stranger.sendall(b"x")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    return thread


def test_strangers_do_not_delay_a_real_host(pool):
    layout = leader_layout()
    future = gather(pool, layout)
    stop = threading.Event()
    with silent_stranger(layout), garbage_stranger(layout):
        trickling = slowloris(layout, stop)
        time.sleep(0.2)  # the leader has accepted all three before the real host comes
        started = time.monotonic()
        join(layout, 1)
        joined = future.result(WAIT)
        elapsed = time.monotonic() - started
    stop.set()
    trickling.join(WAIT)
    assert elapsed < 1.0, f"the join took {elapsed:.1f} s behind three strangers"
    assert [worker.rank for worker in joined.workers] == [1]


def test_a_trickling_stranger_is_cut_at_the_handshake_deadline(monkeypatch, caplog):
    """The deadline bounds the whole handshake, not each read."""
    monkeypatch.setattr(node_admission, "HANDSHAKE_SECONDS", 0.5)
    caplog.set_level(logging.WARNING, logger="octavo.executor.node_admission")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        layout = dataclasses.replace(leader_layout(), master_port=listener.getsockname()[1])
        with node_admission.NodeDoor(listener, KEY.encode()):
            stop = threading.Event()
            started = time.monotonic()
            trickling = slowloris(layout, stop)
            trickling.join(WAIT)  # ends when a byte can no longer be sent
            elapsed = time.monotonic() - started
            stop.set()
    assert elapsed < 2.0, f"a trickling stranger held its handshake for {elapsed:.1f} s"
    assert caplog.text.count("ignored a connection from 127.0.0.1") == 1


def keyed_stranger(layout: NodeLayout, malformed_challenge: bool) -> Connection:
    """A peer that holds the key and then breaks the handshake: a challenge that is not
    one, or a hello that is not a pickle."""
    conn = Connection(connect_raw(layout).detach())
    answer_challenge(conn, KEY.encode())
    if malformed_challenge:
        conn.send_bytes(b"no challenge here")
    else:
        deliver_challenge(conn, KEY.encode())
        conn.send_bytes(b"\x80not a pickle")
    return conn


@pytest.mark.parametrize("malformed_challenge", [True, False])
def test_a_malformed_handshake_drops_that_peer_only(pool, caplog, malformed_challenge):
    caplog.set_level(logging.WARNING, logger="octavo.executor.node_admission")
    layout = leader_layout()
    future = gather(pool, layout)
    with keyed_stranger(layout, malformed_challenge) as stranger, pytest.raises(EOFError):
        stranger.recv_bytes()  # the leader dropped it
    join(layout, 1)
    assert [worker.rank for worker in future.result(WAIT).workers] == [1]
    assert caplog.text.count("ignored a connection from 127.0.0.1") == 1


def test_without_a_key_a_leader_refuses_to_start(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(NodeKeyMissing, match=re.escape(NO_KEY)):
        LLM(str(tmp_path), pipeline_parallel_size=2, nnodes=2)
    with pytest.raises(NodeKeyMissing, match=re.escape(NO_KEY)):
        NodeRendezvous(leader_layout(), WAIT)
    monkeypatch.setattr(server, "run_server", must_not_start)
    assert main(["serve", str(tmp_path), "--pipeline-parallel-size", "2", "--nnodes", "2"]) == 2
    assert NO_KEY in capsys.readouterr().err


def test_without_a_key_a_worker_host_refuses_to_start(monkeypatch, tmp_path, capsys, caplog):
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setattr(headless, "host_overrides", must_not_start)
    flags = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"]
    assert main(["serve", str(tmp_path), *flags, "--headless"]) == 2
    assert NO_KEY in capsys.readouterr().err
    args = EngineArgs(model=str(tmp_path), pipeline_parallel_size=2, nnodes=2, node_rank=1)
    assert headless.run_headless(args) == headless.JOIN_FAILED_EXIT_CODE
    assert NO_KEY in caplog.text


def must_not_start(*args, **kwargs):
    raise AssertionError("started without OCTAVO_NODE_KEY")


def test_a_worker_host_retries_a_peer_that_does_not_speak_the_handshake():
    """Something else on the leader's port (a malformed challenge) is retried like a
    leader not listening yet, then named; the worker host never crashes on it."""
    with socket.create_server(("127.0.0.1", 0)) as impostor:
        layout = NodeLayout(1, 2, 2, node_rank=1, master_port=impostor.getsockname()[1])

        def answer_garbage() -> None:
            with contextlib.suppress(OSError):
                while True:
                    peer, _ = impostor.accept()
                    with peer:
                        peer.sendall(b"\x00\x00\x00\x05hello")

        threading.Thread(target=answer_garbage, daemon=True).start()
        with pytest.raises(NodeChannelError, match=r"did not answer .*AssertionError"):
            connect_to_leader(layout, hello(layout, NODE_LINK), time.monotonic() + 1.5)
