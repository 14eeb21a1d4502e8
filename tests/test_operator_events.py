"""The Events of condition transitions. None is posted into a namespace being deleted:
the apiserver refuses every create there (403 NamespaceTerminating), and kopf retries a
refused Event for about a minute. A first status that already says Ready posts Serving."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from octavo_operator import reconcile
from octavo_operator.kube import Kube
from octavo_operator.reconcile import Controller, Settings
from octavo_operator.status import Observed

from isvc_factories import body

MODEL = {"uri": "hf://org/name", "servedName": "org/name"}


class NamespaceKube(Kube):
    """The real Kube over canned answers: the namespace in ``phase`` (None: gone, an int:
    that error status), status patches recorded."""

    def __init__(self, phase: str | int | None) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.phase = phase
        self.patches: list[dict[str, Any]] = []

    def call(self, method: str, path: str, body: Any = None, *_: Any, **__: Any) -> dict:
        if path == "/api/v1/namespaces/team-a":
            if self.phase is None or isinstance(self.phase, int):
                raise client.ApiException(status=self.phase or 404, reason="refused")
            return {"metadata": {"name": "team-a"}, "status": {"phase": self.phase}}
        if method == "PATCH":
            self.patches.append(body)
            return body
        raise client.ApiException(status=404, reason="Not Found")


@pytest.mark.parametrize(
    ("phase", "terminating"), [("Active", False), ("Terminating", True), (None, True), (403, False)]
)
def test_namespace_terminating_reads_the_phase(phase, terminating):
    """Gone counts as terminating; a refused read does not (the Event is tried)."""
    assert NamespaceKube(phase).namespace_terminating("team-a") is terminating


@pytest.mark.parametrize(("phase", "posted"), [("Active", 1), ("Terminating", 0)])
def test_transitions_are_posted_unless_the_namespace_is_being_deleted(monkeypatch, phase, posted):
    sent: list[list] = []
    monkeypatch.setattr(reconcile, "post_transitions", lambda owner, changed: sent.append(changed))
    kube = NamespaceKube(phase)
    broken = Observed(apply_error="422: Deployment.apps is invalid")  # Degraded: an Event
    assert Controller(kube, Settings()).write_status(body({"model": MODEL}), broken)
    assert kube.patches  # the status is written either way
    assert len(sent) == posted
    if posted:
        assert any(cond.reason == "ApplyFailed" for cond in sent[0])


def test_a_first_status_that_is_already_ready_posts_serving_once(monkeypatch):
    """A busy operator's first status write can come after the pods are ready: that write
    is the only transition, so it posts Serving (seen in e2e: no Serving Event at all), and
    the same status written again posts nothing."""
    sent: list[list] = []
    monkeypatch.setattr(reconcile, "post_transitions", lambda owner, changed: sent.append(changed))
    ready = {
        "metadata": {"generation": 1, "resourceVersion": "10"},
        "spec": {"replicas": 1},
        "status": {
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
            "observedGeneration": 1,
        },
    }
    controller = Controller(NamespaceKube("Active"), Settings())
    owner = body({"model": MODEL})
    assert controller.write_status(owner, Observed(applied_generation=1, deployment=ready))
    assert [(c.type, c.reason) for c in sent[0]] == [("Ready", "Serving")]
    controller.write_status(owner, Observed(applied_generation=1, deployment=ready))
    assert len(sent) == 1
