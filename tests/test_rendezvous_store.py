"""torch.distributed's store is rank 0's to bind: on the rendezvous address only (never
every interface, which ``init_method="tcp://..."`` gives it), and with gloo it stops
listening once every rank has connected, while the ranks' connections keep working.

127.0.0.2 is another address of this host (all of 127/8 is loopback on Linux): a listener
on every interface answers there, one bound to 127.0.0.1 does not."""

from __future__ import annotations

import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from octavo.distributed.rendezvous_store import open_store, rendezvous_address

from multinode_cluster import free_port_pair

TIMEOUT = timedelta(seconds=30)
linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="127.0.0.2 is a local address on Linux only"
)


def answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


@linux_only
def test_the_store_listens_on_the_rendezvous_address_only():
    port = free_port_pair()
    store = open_store(f"tcp://127.0.0.1:{port}", 0, 1, TIMEOUT, close_listener=False)
    store.set("key", "value")
    assert answers("127.0.0.1", port)
    assert not answers("127.0.0.2", port)  # torch's own server would answer here


def test_with_gloo_the_store_stops_listening_once_every_rank_is_in():
    port = free_port_pair()
    method = f"tcp://127.0.0.1:{port}"
    with ThreadPoolExecutor(1) as pool:
        master = pool.submit(open_store, method, 0, 2, TIMEOUT, True)
        client = open_store(method, 1, 2, TIMEOUT, False)
        server = master.result(30)
    assert not answers("127.0.0.1", port)
    client.set("from-rank-1", "a")  # the ranks' own connections still carry the store
    server.set("from-rank-0", "b")
    assert (server.get("from-rank-1"), client.get("from-rank-0")) == (b"a", b"b")


def test_the_rendezvous_address_is_a_tcp_url():
    assert rendezvous_address("tcp://[::1]:8") == ("::1", 8)
    assert rendezvous_address("tcp://leader.group.ns:29502") == ("leader.group.ns", 29502)
    with pytest.raises(ValueError, match="must be tcp://HOST:PORT, got 'env://'"):
        rendezvous_address("env://")


def test_a_master_address_that_is_not_this_hosts_is_a_clear_error():
    port = free_port_pair()
    with pytest.raises(OSError, match="--master-addr must be an address of the leader"):
        open_store(f"tcp://192.0.2.1:{port}", 0, 1, TIMEOUT, close_listener=False)
