"""What counts as someone else changing a child (drift): its generation where the API keeps
one, else its desired fields; a status update (an HPA's every 15 s) is not drift."""

from __future__ import annotations

import kopf

from octavo_operator.reconcile import child_identity, child_version


def hpa(resource_version: str, max_replicas: int, current: int) -> dict:
    return {
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "chat", "resourceVersion": resource_version},
        "spec": {"minReplicas": 1, "maxReplicas": max_replicas},
        "status": {"currentReplicas": current},
    }


def test_status_updates_are_not_drift_but_spec_edits_are() -> None:
    applied = child_version(hpa("10", 4, 1))
    assert child_version(hpa("11", 4, 3)) == applied
    assert child_version(hpa("12", 8, 3)) != applied


def test_config_map_data_and_generations() -> None:
    config = {"kind": "ConfigMap", "metadata": {"resourceVersion": "1"}, "data": {"a": "x"}}
    edited = {**config, "data": {"a": "y"}}
    assert child_version(config) != child_version(edited)
    deployment = {"metadata": {"generation": 4, "resourceVersion": "99"}, "spec": {}}
    assert child_version(deployment) == "g4"


def test_what_the_event_handler_keeps_gives_the_same_version() -> None:
    for obj in (hpa("10", 4, 1), {"kind": "Deployment", "metadata": {"generation": 2}}):
        assert child_version(child_identity(kopf.Body(obj))) == child_version(obj)
