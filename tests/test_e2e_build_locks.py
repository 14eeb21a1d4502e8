"""The e2e control plane's binary groups build under one lock each (e2e/cluster/build.py):
the control plane's groups can be used while the later groups still build, a process that
needs a later group waits for the builder instead of building it a second time, and the Go
build cache is kept until every group is built. Go is replaced by builders that write files."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from e2e.cluster import build

GO = "go1.26.8"


@pytest.fixture
def fake_go(tmp_path, monkeypatch):
    """Builders that write their group's files and log their name; helm's waits for a go."""
    monkeypatch.setenv("OCTAVO_E2E_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "go_version", lambda: (GO, (1, 26)))
    built: list[str] = []
    helm_may_finish = threading.Event()

    def builder(name: str):
        def write(out: Path, logfile: Path) -> None:
            if name == "helm":
                assert helm_may_finish.wait(10), "the test never let helm finish"
            group = build.GROUPS[name]
            for file in (*group.binaries, *group.files):
                (out / file).write_text(name)
            built.append(name)

        return write

    monkeypatch.setattr(build, "BUILDERS", {name: builder(name) for name in build.GROUPS})
    gocache = tmp_path / "go" / "build"
    gocache.mkdir(parents=True)
    (gocache / "entry").write_text("compiled")
    return built, helm_may_finish, gocache


def test_the_cluster_groups_are_usable_while_later_groups_build(fake_go):
    built, helm_may_finish, gocache = fake_go
    everything = threading.Thread(target=build.ensure_built)
    everything.start()
    waiter_paths: dict[str, Path] = {}
    waiter = threading.Thread(target=lambda: waiter_paths.update(build.ensure_built(("lws",))))
    try:
        _wait_until(lambda: built == list(build.CLUSTER_GROUPS))
        paths = build.ensure_built(build.CLUSTER_GROUPS)  # helm is still building
        assert paths["kube-apiserver"].read_text() == "kubernetes"
        assert paths["kwok"].is_file() and gocache.exists()
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive(), "the lws waiter should wait for the builder's lock"
    finally:
        helm_may_finish.set()
        everything.join(10)
        waiter.join(10)
    assert built == list(build.GROUPS)  # each group once: the waiter built nothing
    assert waiter_paths["lws-controller"].read_text() == "lws"
    assert not gocache.exists()  # emptied once every group was built


def test_the_go_cache_is_kept_while_groups_are_missing(fake_go):
    built, helm_may_finish, gocache = fake_go
    helm_may_finish.set()
    build.ensure_built(build.CLUSTER_GROUPS)
    assert built == list(build.CLUSTER_GROUPS) and gocache.exists()
    build.ensure_built(("epp",))
    assert built[-1] == "epp" and gocache.exists()
    build.ensure_built()
    assert built == [*build.CLUSTER_GROUPS, "epp", "helm", "lws"]
    assert not gocache.exists()


def _wait_until(condition, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition never held")
