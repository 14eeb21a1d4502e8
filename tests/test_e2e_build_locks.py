"""The e2e control plane's binary groups build under one lock each (e2e/cluster/build.py):
the control plane's groups can be used while the later groups still build, a process that
needs a group another one is building waits for that group only (it never builds it a
second time), and the Go build cache is kept until every group is built. Go is replaced by
builders that write files."""

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


def test_a_group_is_usable_as_soon_as_it_is_built_and_built_once(fake_go):
    built, helm_may_finish, gocache = fake_go
    everything = threading.Thread(target=build.ensure_built)
    everything.start()
    helm_paths: dict[str, Path] = {}
    helm_waiter = threading.Thread(target=lambda: helm_paths.update(build.ensure_built(("helm",))))
    try:
        _wait_until(lambda: built == list(build.CLUSTER_GROUPS))
        paths = build.ensure_built(build.CLUSTER_GROUPS)  # helm is still building
        assert paths["kube-apiserver"].read_text() == "kubernetes"
        assert paths["kwok"].is_file() and gocache.exists()
        helm_waiter.start()
        helm_waiter.join(0.3)
        assert helm_waiter.is_alive(), "helm's waiter should wait for the builder's lock"
        lws = build.ensure_built(("lws",))  # not held: built here, without waiting for helm
        assert lws["lws-controller"].read_text() == "lws" and helm_waiter.is_alive()
    finally:
        helm_may_finish.set()
        everything.join(10)
        helm_waiter.join(10)
    assert sorted(built) == sorted(build.GROUPS)  # each group once: the waiter built nothing
    assert helm_paths["helm"].read_text() == "helm"
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
