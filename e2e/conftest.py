"""Fixtures for the e2e suite: one real control plane per session, a fresh namespace per test.

- `cluster` (session): the running test cluster of this checkout; brought up if it is not
  running, and stopped at the end only if this session started it (set
  OCTAVO_E2E_KEEP_CLUSTER=1 to leave it running).
- `api_client` and typed clients (`core`, `apps`, `rbac`, `apiext`, `custom`): the admin.
- `namespace` (function): a new namespace, deleted after the test.
- `kubectl`, `helm`: run the built binaries against the cluster.
- `lws_controller` (session, on request): the LeaderWorkerSet controller and its webhooks.
- On a failure, the last lines of every component's log are added to the report.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from e2e import cluster as e2e_cluster
from e2e.cluster import build, control_plane
from e2e.helpers import wait_for
from e2e.lws_controller import LwsController
from e2e.operator_process import OperatorProcess, install_crd, install_rbac
from e2e.pod_process import PodProcess
from tests.suite_timing import pytest_terminal_summary  # noqa: F401  (the suite's time budget)

LOG_TAIL_LINES = 25
SESSION_OPERATORS: list[OperatorProcess] = []
_build_error: Exception | None = None


def _uses_cluster(item: pytest.Item) -> bool:
    return "cluster" in getattr(item, "fixturenames", ())


def _serves_pods(item: pytest.Item) -> bool:
    """The test's module runs pods for real (``PodProcess``: ``octavo serve`` processes)."""
    module = getattr(item, "module", None)
    return getattr(module, "PodProcess", None) is PodProcess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``serving`` the tests whose pods run ``octavo serve`` (CPU and memory), so a
    person can select them (``-m serving``) or leave them out (``-m "not serving"``)."""
    for item in items:
        if _serves_pods(item):
            item.add_marker(pytest.mark.serving)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build missing binaries before the first test, outside any per-test timeout: a cold build
    takes many minutes (`python -m e2e.cluster build` does the same ahead of time)."""
    global _build_error
    if session.config.option.collectonly or not any(_uses_cluster(i) for i in session.items):
        return
    try:
        build.ensure_built()
    except Exception as exc:  # reported by the `cluster` fixture, test by test
        _build_error = exc


@pytest.fixture(scope="session")
def cluster() -> Iterator[e2e_cluster.Cluster]:
    if _build_error is not None:
        raise _build_error
    running = e2e_cluster.status()
    c = running or e2e_cluster.up()
    yield c
    if running is None and os.environ.get("OCTAVO_E2E_KEEP_CLUSTER", "") in ("", "0"):
        e2e_cluster.down()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _uses_cluster(item):
        # The operator's log first: a report cut short keeps its head
        operator = item.funcargs.get("operator") if hasattr(item, "funcargs") else None
        if isinstance(operator, OperatorProcess):
            report.sections.append(("operator log", operator.tail(LOG_TAIL_LINES)))
        logs = control_plane.state_dir() / "logs"
        for name in control_plane.COMPONENTS:
            text = control_plane.tail_log(logs / f"{name}.log", LOG_TAIL_LINES)
            report.sections.append((f"{name} log (last {LOG_TAIL_LINES} lines)", text))
        lws = item.funcargs.get("lws_controller") if hasattr(item, "funcargs") else None
        if isinstance(lws, LwsController):
            report.sections.append(("lws-controller log", lws.tail(LOG_TAIL_LINES)))


@pytest.fixture(scope="session")
def api_client(cluster: e2e_cluster.Cluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


@pytest.fixture(scope="session")
def rbac(api_client: client.ApiClient) -> client.RbacAuthorizationV1Api:
    return client.RbacAuthorizationV1Api(api_client)


@pytest.fixture(scope="session")
def apiext(api_client: client.ApiClient) -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(api_client)


@pytest.fixture(scope="session")
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")
    slug = slug.removeprefix("test-")[:40].strip("-")
    return f"e2e-{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core: client.CoreV1Api) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    body = {"metadata": {"name": name, "labels": {"octavo.dev/e2e": "true"}}}
    core.create_namespace(body)

    def default_sa() -> bool:
        sas = core.list_namespaced_service_account(name, field_selector="metadata.name=default")
        return bool(sas.items)

    # Pods are refused until the serviceaccount controller made `default`.
    wait_for(default_sa, timeout=30, what=f"ServiceAccount default in {name}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _runner(binary: Path, env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(binary), *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{binary.name} {' '.join(args)} exited {proc.returncode}:\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc

    return run


@pytest.fixture
def kubectl(cluster: e2e_cluster.Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    return _runner(cluster.binary("kubectl"), {**os.environ, **cluster.env()})


@pytest.fixture
def helm(
    cluster: e2e_cluster.Cluster, tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    homes = {
        f"HELM_{kind}_HOME": str(tmp_path / "helm" / kind.lower())
        for kind in ("CACHE", "CONFIG", "DATA")
    }
    return _runner(cluster.binary("helm"), {**os.environ, **cluster.env(), **homes})


@pytest.fixture(scope="session")
def operator(
    cluster: e2e_cluster.Cluster,
    api_client: client.ApiClient,
    apiext: client.ApiextensionsV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The operator, running for the whole session under its own RBAC (see operator_process)."""
    install_crd(apiext)
    install_rbac(api_client)
    proc = OperatorProcess(cluster, tmp_path_factory.mktemp("operator"))
    proc.start()
    SESSION_OPERATORS.append(proc)
    yield proc
    SESSION_OPERATORS.remove(proc)
    proc.stop()


@pytest.fixture(scope="session")
def lws_controller(
    cluster: e2e_cluster.Cluster,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LwsController]:
    """The LeaderWorkerSet controller and its webhooks, for the tests that request it (not
    an always-on component: its webhooks fail closed). Webhooks go before the process."""
    controller = LwsController(cluster, api_client, tmp_path_factory.mktemp("lws"))
    try:
        controller.start()
        yield controller
    finally:
        controller.stop()


@pytest.fixture
def no_other_operator() -> None:
    """Pause the session's operator (if one runs) while a test runs its own: two operators
    would both reconcile every InferenceService. It stays paused until a test that asks for
    it (`operator`) starts (`resume_session_operator`): tests that run their own operators
    one after the other (lifecycle, adapters, churn, failover) do not restart it between
    them."""
    for proc in SESSION_OPERATORS:
        if proc.proc is not None:
            proc.stop()


def _needs_session_operator(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "operator" in names and "no_other_operator" not in names


def _resume_session_operators() -> None:
    for proc in SESSION_OPERATORS:
        if proc.proc is None:
            proc.start()


@pytest.fixture(scope="module", autouse=True)
def resume_session_operator_for_module(request: pytest.FixtureRequest) -> None:
    """Start the session's operator again, if a `no_other_operator` test paused it, before
    a module whose tests use it: its module-scoped fixtures (test_router's) come before any
    function-scoped one. (The first user starts it with `operator`.)"""
    if any(
        _needs_session_operator(i)
        for i in request.session.items
        if getattr(i, "module", None) is request.module
    ):
        _resume_session_operators()


@pytest.fixture(autouse=True)
def resume_session_operator(request: pytest.FixtureRequest) -> None:
    """The same before each test that uses it (a module may mix both kinds of test)."""
    if _needs_session_operator(request.node):
        _resume_session_operators()
