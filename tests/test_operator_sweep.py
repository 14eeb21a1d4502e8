"""The sweep (operator/octavo_operator/sweep.py): a service the API server no longer has,
its DELETED event never delivered, is forgotten, and kopf's stale index entry for it is
refused from then on; a service still listed, one recorded while the list was in flight,
and a namesake created later are kept. A child changed or deleted unseen is handed to the
drift check; an unchanged one, and the children of a service reconciled after the lists
were asked for, are not."""

from __future__ import annotations

import copy
from typing import Any

import kopf

from octavo_operator import metrics
from octavo_operator.handlers import CHILD_RESOURCES, reconcile_isvc
from octavo_operator.kube import PLURALS
from octavo_operator.reconcile import Applied, Controller, Settings
from octavo_operator.sweep import METADATA_ONLY, Sweeper

from isvc_factories import body

KEY = ("team-a", "chat")


KINDS = {plural: kind for kind, plural in PLURALS.items()}


class ListingKube:
    """Lists the services with the given uids, and the children in `children` (by plural);
    answers applies with the object itself."""

    def __init__(self, uids: list[str]) -> None:
        self.uids = uids
        self.children: dict[str, list[dict[str, Any]]] = {}
        self.applied: list[dict[str, Any]] = []
        self.lists: list[tuple[str, Any]] = []
        self.while_listing = lambda: None

    def served(self, group_version: str, plural: str) -> bool:
        return plural == "deployments"  # of the optional kinds' groups, apps only

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return obj

    def call(self, method: str, path: str, query: Any = None, **headers: str) -> dict[str, Any]:
        assert method == "GET"
        self.lists.append((path, query or headers))
        self.while_listing()
        plural = path.rsplit("/", 1)[1]
        if plural == "inferenceservices":
            return {"items": [{"metadata": {"uid": uid}} for uid in self.uids]}
        items = [copy.deepcopy(obj) for obj in self.children.get(plural, [])]
        return {"kind": f"{KINDS[plural]}List", "items": items}


class StatusRequests(list):
    def request(self, key: tuple[str, str], indexes: dict[str, Any]) -> None:
        self.append(key)


def reconcile(controller: Controller, indexed: dict[str, Any]) -> None:
    """reconcile_isvc as kopf calls it, with INDEXED as the service's entry in its index."""
    empty: dict = {}
    reconcile_isvc(
        body=indexed,
        namespace="team-a",
        name="chat",
        reason="create",
        memo=kopf.Memo(controller=controller),
        isvc_index={KEY: [indexed]},
        deployment_index=empty,
        picker_index=empty,
        lws_index=empty,
        pod_index=empty,
        claim_index=empty,
    )


def tracked_controller(listed_uids: list[str]) -> tuple[ListingKube, Controller]:
    kube = ListingKube(listed_uids)
    controller = Controller(kube, Settings())
    controller.statuses = StatusRequests()
    reconcile(controller, body())
    assert controller.applied[KEY].uid == "uid-1"
    for obj in kube.applied:  # the children as the API server now holds them
        kube.children.setdefault(PLURALS[obj["kind"]], []).append(obj)
    kube.applied.clear()
    return kube, controller


def sweeper(controller: Controller) -> tuple[Sweeper, list[tuple[Any, ...]]]:
    handed: list[tuple[Any, ...]] = []

    def check(key: tuple[str, str], child: dict[str, Any], deleted: bool) -> None:
        handed.append((key, child["kind"], deleted))

    return Sweeper(controller, CHILD_RESOURCES, check), handed


def test_a_service_the_list_lacks_is_forgotten_and_its_stale_entry_refused() -> None:
    kube, controller = tracked_controller(listed_uids=[])
    assert Sweeper(controller).sweep() == [KEY]
    assert kube.lists == [
        ("/apis/octavo.dev/v1alpha1/namespaces/team-a/inferenceservices", {"Accept": METADATA_ONLY})
    ]
    assert KEY not in controller.applied and metrics.TRACKED_SERVICES._value.get() == 0
    reconcile(controller, body())  # kopf's index still offers the deleted service
    assert kube.applied == [] and KEY not in controller.applied


def test_a_listed_service_is_kept() -> None:
    _, controller = tracked_controller(listed_uids=["uid-1"])
    assert Sweeper(controller).sweep() == []
    assert KEY in controller.applied and controller.gone == {}


def test_a_reconcile_recorded_while_the_list_was_in_flight_is_kept() -> None:
    kube, controller = tracked_controller(listed_uids=[])
    kube.while_listing = lambda: controller.applied.__setitem__(KEY, Applied(uid="uid-1"))
    assert Sweeper(controller).sweep() == []
    assert KEY in controller.applied


def test_a_namesake_created_after_the_sweep_is_reconciled() -> None:
    kube, controller = tracked_controller(listed_uids=[])
    Sweeper(controller).sweep()
    reconcile(controller, body(uid="uid-2"))
    assert {obj["kind"] for obj in kube.applied} >= {"Deployment", "Service"}
    assert controller.applied[KEY].uid == "uid-2" and controller.gone == {}


def test_children_changed_or_deleted_unseen_are_handed_to_the_drift_check() -> None:
    kube, controller = tracked_controller(listed_uids=["uid-1"])
    sweep, handed = sweeper(controller)
    assert sweep.sweep_children() == [] and handed == []  # as applied: nothing to do
    kube.children["deployments"][0]["spec"]["replicas"] = 7
    kube.children["services"] = []
    assert len(sweep.sweep_children()) == 2
    assert sorted(handed) == [(KEY, "Deployment", False), (KEY, "Service", True)]
    selectors = {str(query) for path, query in kube.lists if "inferenceservices" not in path}
    assert selectors == {"[('labelSelector', 'app.kubernetes.io/managed-by=octavo-operator')]"}


def test_the_children_of_a_service_reconciled_after_the_lists_are_left_alone() -> None:
    kube, controller = tracked_controller(listed_uids=["uid-1"])
    kube.children["services"] = []
    kube.while_listing = lambda: reconcile(controller, body())  # records a new Applied
    sweep, handed = sweeper(controller)
    assert sweep.sweep_children() == [] and handed == []
