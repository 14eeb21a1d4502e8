"""A deleted InferenceService is forgotten even when a reconcile of it is in flight: the
forget waits for the service's lock, and a reconcile that starts after the delete (its
service gone from kopf's index) applies and records nothing."""

from __future__ import annotations

import threading
from typing import Any

import kopf

from octavo_operator import metrics
from octavo_operator.handlers import reconcile_isvc
from octavo_operator.reconcile import Applied, Controller, Settings

from isvc_factories import body

KEY = ("team-a", "chat")


class RecordingKube:
    """Answers applies with the object itself; remembers what was applied."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def served(self, group_version: str, plural: str) -> bool:
        return False

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return obj


def tracked_gauge() -> float:
    return metrics.TRACKED_SERVICES._value.get()


def test_forget_waits_for_the_reconcile_in_flight() -> None:
    controller = Controller(RecordingKube(), Settings())
    lock = controller.lock(KEY)
    lock.acquire()  # a reconcile holds the lock...
    forgetting = threading.Thread(target=controller.forget, args=(KEY,))
    forgetting.start()
    forgetting.join(timeout=0.2)
    assert forgetting.is_alive(), "forget went ahead of the reconcile in flight"
    controller.applied[KEY] = Applied(generation=3)  # ...and records what it applied
    lock.release()
    forgetting.join(timeout=5)
    assert KEY not in controller.applied
    assert tracked_gauge() == 0


class StatusRequests(list):
    def request(self, key: tuple[str, str], indexes: dict[str, Any]) -> None:
        self.append(key)


def reconcile_with_index(isvc_index: dict) -> tuple[RecordingKube, Controller]:
    kube = RecordingKube()
    controller = Controller(kube, Settings())
    controller.statuses = StatusRequests()
    indexes = {
        "isvc_index": isvc_index,
        "deployment_index": {},
        "picker_index": {},
        "lws_index": {},
        "pod_index": {},
        "claim_index": {},
    }
    reconcile_isvc(
        body=body(),
        namespace="team-a",
        name="chat",
        reason="create",
        memo=kopf.Memo(controller=controller),
        **indexes,
    )
    return kube, controller


def test_a_reconcile_after_the_delete_applies_and_keeps_nothing() -> None:
    kube, controller = reconcile_with_index({})
    assert kube.applied == [] and KEY not in controller.applied
    assert controller.statuses == []


def test_a_reconcile_of_an_indexed_service_applies_and_records() -> None:
    kube, controller = reconcile_with_index({KEY: [body()]})
    assert {obj["kind"] for obj in kube.applied} >= {"Deployment", "Service"}
    assert controller.applied[KEY].generation == 3 and controller.statuses == [KEY]
