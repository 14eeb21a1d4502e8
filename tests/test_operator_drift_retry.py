"""A drift correction that fails on a transient error is tried again (reconcile_retry): a
service whose last reconcile failed reads no drift, so without the retry one apiserver
timeout left its child drifted until the spec changed."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
import pytest
import urllib3
from kubernetes import client

from octavo_operator import reconcile_retry
from octavo_operator.handlers import correct_drift
from octavo_operator.kube import Kube
from octavo_operator.reconcile import Controller, Settings, TransientError, child_identity

from isvc_factories import body

KEY = ("team-a", "chat")


class FlakyKube:
    """Answers applies with the object itself, except for the FAILURES next ones (504)."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.failures = 0
        self.lock = threading.Lock()

    def served(self, group_version: str, plural: str) -> bool:
        return False

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if self.failures:
                self.failures -= 1
                raise client.ApiException(status=504, reason="Gateway Timeout")
            self.applied.append(obj)
        return obj


class StatusRequests(list):
    def request(self, key: tuple[str, str], indexes: dict[str, Any]) -> None:
        self.append(key)


@pytest.fixture
def reconciled(monkeypatch: pytest.MonkeyPatch):
    """A controller that reconciled KEY once, with a drift-check thread and a 50 ms retry."""
    monkeypatch.setattr(reconcile_retry, "RETRY_DELAY_SECONDS", 0.05)
    kube = FlakyKube()
    controller = Controller(kube, Settings())
    controller.statuses = StatusRequests()
    controller.drift_checks = ThreadPoolExecutor(1)
    indexes = {"isvc_index": {KEY: [body()]}}
    controller.reconcile(body(), trigger="create")
    yield kube, controller, indexes
    controller.drift_checks.shutdown(wait=True)


def edited_deployment(kube: FlakyKube) -> kopf.Body:
    deployment = copy.deepcopy(next(o for o in kube.applied if o["kind"] == "Deployment"))
    deployment["spec"]["replicas"] = 7  # someone else's edit
    return kopf.Body(deployment)


def wait_until(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_failed_correction_is_retried_until_it_goes_through(reconciled) -> None:
    kube, controller, indexes = reconciled
    kube.failures = 2  # the correction and its first retry time out
    applies_before = len(kube.applied)
    with controller.lock(KEY):
        correct_drift(controller, KEY, child_identity(edited_deployment(kube)), False, indexes)
    assert controller.applied[KEY].error is not None
    assert wait_until(lambda: controller.applied[KEY].error is None)
    assert len(kube.applied) > applies_before and kube.failures == 0
    assert wait_until(lambda: controller.statuses == [KEY, KEY])  # each retry rewrites it


def test_no_retry_once_the_service_is_gone(reconciled) -> None:
    kube, controller, indexes = reconciled
    kube.failures = 1
    with controller.lock(KEY):
        correct_drift(controller, KEY, child_identity(edited_deployment(kube)), False, indexes)
        indexes["isvc_index"].clear()  # deleted before the retry
        applies_before = len(kube.applied)
    time.sleep(0.3)
    assert len(kube.applied) == applies_before and controller.statuses == []


class TimingOutApi:
    """An ApiClient whose requests all time out before the API server answers."""

    def param_serialize(self, method: str, path: str, **kwargs: Any) -> tuple:
        return method, f"https://apiserver{path}", {}, None, None

    def call_api(self, method: str, url: str, **kwargs: Any) -> Any:
        raise urllib3.exceptions.ReadTimeoutError(None, url, "Read timed out. (read timeout=30)")


def test_a_request_the_api_server_never_answers_is_a_transient_reconcile_error() -> None:
    """Before: urllib3's ReadTimeoutError went past the controller: no error in the status,
    no reconcile counted, and kopf retried it as a crash 60 s later."""
    controller = Controller(Kube(TimingOutApi()), Settings())
    with pytest.raises(
        TransientError, match=r"the API server did not answer GET /apis/.*: ReadTimeoutError"
    ):
        controller.reconcile(body(), trigger="create")
    error = controller.applied[KEY].error
    assert error.startswith("the API server did not answer GET /apis/"), error
