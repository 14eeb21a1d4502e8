"""spec.engine.nodes > 1: the status comes from the LeaderWorkerSet (counted in groups), a
cluster without the LWS API gets a clear condition and Event instead of an error loop, and
the node key Secret is created once and never rewritten."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from kubernetes import client

from octavo_operator.adapter_sync import ready_pod_addresses
from octavo_operator.api.crd import custom_resource_definition
from octavo_operator.conditions import transitions
from octavo_operator.handlers import workload
from octavo_operator.node_key import ensure_node_key
from octavo_operator.reconcile import Applied, Controller, Settings
from octavo_operator.status import Observed, compute, deployment_summary

from isvc_factories import body, isvc

TWO_NODES = {"engine": {"nodes": 2, "pipelineParallelSize": 2}}
KEY = ("team-a", "chat")


def lws(replicas=2, ready=2, updated=2, generation=4, observed=4) -> dict[str, Any]:
    """A LeaderWorkerSet as the API returns it (its status counts groups)."""
    return deployment_summary(
        {
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "chat-lws", "generation": generation, "resourceVersion": "50"},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 2}},
            "status": {
                "replicas": replicas,
                "readyReplicas": ready,
                "updatedReplicas": updated,
                "observedGeneration": observed,
                "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=chat-lws,"
                "leaderworkerset.sigs.k8s.io/worker-index=0",
                "conditions": [{"type": "Available", "status": "True", "reason": "AllGroupsReady"}],
            },
        }
    )


def conditions(spec: dict[str, Any], **observed: Any) -> dict[str, Any]:
    _, conds = compute(isvc(spec), Observed(applied_generation=3, **observed))
    return {c.type: c for c in conds}


def test_ready_groups_make_the_service_ready() -> None:
    fields, conds = compute(isvc(TWO_NODES), Observed(applied_generation=3, deployment=lws()))
    assert (fields["replicas"], fields["readyReplicas"], fields["updatedReplicas"]) == (2, 2, 2)
    # /scale's selector (what an HPA averages its per-pod metric over): the leaders only.
    assert fields["selector"] == (
        "app.kubernetes.io/name=octavo-server,app.kubernetes.io/instance=chat,"
        "app.kubernetes.io/component=server"
    )
    ready = {c.type: c for c in conds}["Ready"]
    assert (ready.status, ready.reason) == (True, "Serving")


def test_a_group_still_loading_is_not_ready() -> None:
    c = conditions(TWO_NODES, deployment=lws(ready=1))
    assert (c["Ready"].status, c["Ready"].reason) == (False, "ReplicasNotReady")
    assert (c["Progressing"].status, c["Progressing"].reason) == (True, "RollingOut")
    stale = conditions(TWO_NODES, deployment=lws(generation=5, observed=4))
    assert stale["Progressing"].status, "the LWS controller has not seen the new spec yet"


def test_before_the_group_exists_the_lws_is_being_created() -> None:
    c = conditions(TWO_NODES, lws_served=True)
    assert c["Progressing"].message == "creating the LeaderWorkerSet"
    assert conditions({})["Progressing"].message == "creating the Deployment"


def test_without_the_lws_api_the_service_is_degraded_with_the_install_command() -> None:
    c = conditions(TWO_NODES, lws_served=False)
    degraded = c["Degraded"]
    assert (degraded.status, degraded.reason) == (True, "LeaderWorkerSetAPIMissing")
    assert "leaderworkerset.x-k8s.io/v1" in degraded.message
    assert "lws/releases/download/v0.9.0/manifests.yaml" in degraded.message
    assert (c["Ready"].status, c["Ready"].reason) == (False, "LeaderWorkerSetAPIMissing")
    # An Event on the first observation (Degraded=True is news on its own).
    _, conds = compute(isvc(TWO_NODES), Observed(lws_served=False))
    assert "LeaderWorkerSetAPIMissing" in {t.reason for t in transitions([], conds)}
    # One node needs no LWS: its absence is nobody's problem.
    assert conditions({}, lws_served=False)["Degraded"].status is False


def test_the_status_reads_the_workload_of_the_current_node_count() -> None:
    """After engine.nodes changes, the old kind's copy (in the index or from the last
    apply) is not the workload."""
    deployment = {
        "kind": "Deployment",
        "metadata": {"resourceVersion": "90"},
        "spec": {"replicas": 1},
        "status": {},
    }
    indexes = {"deployment_index": {KEY: [deployment]}, "lws_index": {KEY: [lws()]}}
    multi, single = isvc(TWO_NODES), isvc({})
    assert workload(multi, Applied(deployment=deployment), indexes)["kind"] == "LeaderWorkerSet"
    assert workload(single, Applied(deployment=lws()), indexes)["kind"] == "Deployment"
    assert workload(multi, None, {"deployment_index": {}, "lws_index": {}}) is None


def pod(name: str, component: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": component}},
        "status": {
            "podIP": f"10.0.0.{len(name)}",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_headless_workers_are_never_scraped_or_sent_adapters() -> None:
    """The idle scaler, the adapter sync and the activator use ready_pod_addresses."""
    pods = [pod("chat-lws-0", "server"), pod("chat-lws-0-1", "worker")]
    assert list(ready_pod_addresses(pods)) == ["chat-lws-0"]


class FakeKube:
    """Serves or lacks the LWS API; remembers Secrets, creates and applies."""

    def __init__(self, lws_served: bool) -> None:
        self.lws_served = lws_served
        self.secrets: dict[str, dict[str, Any]] = {}
        self.applied: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []

    def served(self, group_version: str, plural: str) -> bool:
        return self.lws_served and plural == "leaderworkersets"

    def call(self, method: str, path: str, *_: Any, **__: Any) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if method == "GET" and "/secrets/" in path and name in self.secrets:
            return self.secrets[name]
        raise client.ApiException(status=404, reason="Not Found")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        if name in self.secrets:
            raise client.ApiException(status=409, reason="AlreadyExists")
        self.created.append(obj)
        self.secrets[name] = obj
        return obj

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return {**obj, "metadata": {**obj["metadata"], "generation": 1}}

    def delete(self, *_: Any) -> bool:
        return False


def test_a_reconcile_creates_the_key_once_then_the_group() -> None:
    kube = FakeKube(lws_served=True)
    controller = Controller(kube, Settings())  # type: ignore[arg-type]
    applied = controller.reconcile(body(TWO_NODES), trigger="create")
    assert [o["kind"] for o in kube.applied][:2] == ["LeaderWorkerSet", "Service"]
    assert applied.deployment is not None and applied.deployment["kind"] == "LeaderWorkerSet"
    (secret,) = kube.created
    assert secret["metadata"]["name"] == "chat-node-key"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    key = base64.b64decode(secret["data"]["node-key"])
    assert len(key) >= 32
    controller.reconcile(body(TWO_NODES), trigger="update")
    controller.reconcile(body(TWO_NODES), trigger="resume")
    assert kube.created == [secret], "never rewritten: running groups keep their key"


def test_every_service_gets_its_own_key() -> None:
    kube = FakeKube(lws_served=True)
    assert ensure_node_key(kube, isvc(TWO_NODES))  # type: ignore[arg-type]
    assert ensure_node_key(kube, isvc(TWO_NODES, name="other"))  # type: ignore[arg-type]
    keys = {s["data"]["node-key"] for s in kube.secrets.values()}
    assert len(keys) == 2


def test_a_key_created_meanwhile_is_kept() -> None:
    class Racing(FakeKube):
        def call(self, method: str, path: str, *_: Any, **__: Any) -> dict[str, Any]:
            self.secrets.setdefault("chat-node-key", {"data": {"node-key": "b2xk"}})
            raise client.ApiException(status=404, reason="Not Found")

    kube = Racing(lws_served=True)
    assert ensure_node_key(kube, isvc(TWO_NODES)) is False  # type: ignore[arg-type]
    assert kube.secrets["chat-node-key"]["data"]["node-key"] == "b2xk"


def test_without_the_lws_api_a_reconcile_applies_no_group_and_no_key() -> None:
    kube = FakeKube(lws_served=False)
    controller = Controller(kube, Settings())  # type: ignore[arg-type]
    applied = controller.reconcile(body(TWO_NODES), trigger="create")
    assert applied.error is None and applied.lws_served is False
    assert "LeaderWorkerSet" not in [o["kind"] for o in kube.applied]
    assert kube.created == []


def engine_schema() -> dict[str, Any]:
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]["properties"]["engine"]


def test_nodes_is_an_engine_field_of_one_to_sixty_four_hosts() -> None:
    nodes = engine_schema()["properties"]["nodes"]
    assert (nodes["type"], nodes["minimum"], nodes["maximum"], nodes["default"]) == (
        "integer",
        1,
        64,
        1,
    )
    assert "LeaderWorkerSet" in nodes["description"]


def test_a_multi_node_name_leaves_room_for_the_statefulsets_revision_label() -> None:
    """Worker StatefulSets are NAME-lws-GROUP (groups up to 999); each pod's
    controller-revision-hash label is that plus '-' and a 10-character hash."""
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = [r for r in root["x-kubernetes-validations"] if "nodes" in r["rule"]]
    assert rule["rule"] == "self.spec.engine.nodes <= 1 || self.metadata.name.size() <= 44"
    longest_label = "x" * 44 + "-lws-999" + "-" + "1234567890"
    assert len(longest_label) == 63


class Obj:
    """A schema object as CEL sees it: fields by attribute, has() false for a missing one."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        if name not in self.fields:
            raise AttributeError(name)
        value = self.fields[name]
        return Obj(value) if isinstance(value, dict) else value


CEL_WORDS = re.compile(r"self(\.\w+)+|has|\d+|'\w+'|\|\||&&|!|==|<=|>|\*|%|\(|\)|\s+")


def evaluate(rule: str, self: Obj) -> bool:
    """A CEL rule of the layout kind (has, ||, &&, !, comparisons, * and % on integers,
    'word' literals), as Python: these have the same meaning and order in both languages."""
    assert CEL_WORDS.sub("", rule) == "", f"not a rule of the supported kind: {rule}"
    python = re.sub(r"has\(([^)]*)\)", r"_has(lambda: \1)", rule)
    python = python.replace("||", " or ").replace("&&", " and ").replace("!", " not ")
    python = python.replace(" not =", "!=")

    def _has(read: Any) -> bool:
        try:
            read()
        except AttributeError:
            return False
        return True

    return bool(eval(python, {"_has": _has, "self": self}))


def layout_rules() -> list[tuple[str, dict[str, Any]]]:
    """(rule, where it applies: 'spec' or 'engine') for the rules that name the layout."""
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]
    engine = spec["properties"]["engine"]
    return [
        *((r["rule"], "spec") for r in spec["x-kubernetes-validations"] if "Parallel" in r["rule"]),
        *(
            (r["rule"], "engine")
            for r in engine["x-kubernetes-validations"]
            if "nodes" in r["rule"] and "extraArgs" not in r["rule"]
        ),
    ]


@pytest.mark.parametrize(
    ("tensor", "pipeline", "nodes", "gpu", "allowed"),
    [
        (2, 2, 2, 2, True),
        (4, 2, 2, 4, True),
        (4, 2, 2, 8, False),  # 8 GPUs a node for 4 ranks a node
        (4, 2, 2, 2, False),  # too few: one GPU per rank
        (2, 2, 2, None, True),  # the default: 2 per node
        (2, 2, 2, 0, True),  # CPU ranks as processes
        (2, 1, 2, 1, True),  # TP across two hosts
        (3, 1, 2, 0, False),  # 3 ranks do not split over 2 nodes
        (2, 3, 3, 2, True),
        (4, 1, 1, 8, True),  # one node: at least one GPU per rank, as before
        (4, 1, 1, 2, False),
    ],
)
def test_the_crds_layout_rules(tensor, pipeline, nodes, gpu, allowed) -> None:
    """The generated CRD's layout rules evaluated on a spec with its defaults filled in, as
    the apiserver checks them. (e2e/test_operator_validation.py can mirror the table.)"""
    engine = {
        **engine_schema()["default"],
        "tensorParallelSize": tensor,
        "pipelineParallelSize": pipeline,
        "nodes": nodes,
    }
    resources = {} if gpu is None else {"gpu": gpu}
    spec = Obj({"engine": engine, "resources": resources, "model": {}})
    rules = layout_rules()
    assert len(rules) == 3
    verdicts = [evaluate(r, spec if at == "spec" else Obj(engine)) for r, at in rules]
    assert all(verdicts) is allowed, verdicts


def cache_rule() -> str:
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = root["properties"]["spec"]["x-kubernetes-validations"]
    (rule,) = [r["rule"] for r in rules if "accessMode" in r["rule"]]
    return rule


@pytest.mark.parametrize(
    ("nodes", "cache", "allowed"),
    [
        (2, {"size": "10Gi", "accessMode": "ReadWriteOnce"}, False),
        (2, {"size": "10Gi", "accessMode": "ReadWriteOncePod"}, False),
        (2, {"size": "10Gi", "accessMode": "ReadWriteMany"}, True),
        (2, {"claimName": "shared"}, True),  # an existing claim: its access mode is the user's
        (2, None, True),
        (1, {"size": "10Gi", "accessMode": "ReadWriteOnce"}, True),
    ],
)
def test_a_group_needs_a_cache_every_host_can_mount(nodes, cache, allowed) -> None:
    fields: dict[str, Any] = {"engine": {"nodes": nodes}}
    if cache is not None:
        fields["cache"] = cache
    assert evaluate(cache_rule(), Obj(fields)) is allowed
