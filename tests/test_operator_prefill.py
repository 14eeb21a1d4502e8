"""spec.prefill: the prefill Deployment, the decode pods' routing sidecar and KV-transfer
flags (with spec.prefill.kvTransfer), the picker's P/D profiles, a disruption budget and a
PodMonitor per pool, the status of both pools, a bad spec.prefill, and names of the
prefill pool's objects that another owner holds (never taken over, never deleted)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from octavo.cli import build_parser
from octavo.kv_transfer.config import KVTransferConfig
from octavo_operator import constants as c
from octavo_operator.api.prefill import sets_flag
from octavo_operator.builders.children import ChildRef, desired_children
from octavo_operator.builders.picker_config import endpoint_picker_config
from octavo_operator.conditions import transitions
from octavo_operator.handlers import named, workload
from octavo_operator.kube import Kube, object_path
from octavo_operator.reconcile import Controller, Settings
from octavo_operator.status import Observed, compute

from isvc_factories import body, isvc

MODEL = {"uri": "hf://org/name", "servedName": "org/name"}
PD = {
    "model": MODEL,
    "router": {"enabled": True},
    "resources": {"gpu": 1, "cpu": "4"},
    "engine": {"extraArgs": ["--max-num-seqs", "64"]},
    "prefill": {
        "replicas": 2,
        "resources": {"cpu": "8"},
        "engine": {"extraArgs": ["--max-num-batched-tokens", "8192"]},
    },
}
SIDECAR_RBAC = [
    ChildRef("v1", "ServiceAccount", "chat-pd-sidecar"),
    ChildRef("rbac.authorization.k8s.io/v1", "Role", "chat-pd-sidecar"),
    ChildRef("rbac.authorization.k8s.io/v1", "RoleBinding", "chat-pd-sidecar"),
]


def children(spec: dict[str, Any], sidecar_image: str = c.DEFAULT_SIDECAR_IMAGE) -> dict:
    out = desired_children(
        isvc(spec),
        "octavo:1",
        service_monitors_served=False,
        inference_pools_served=True,
        sidecar_image=sidecar_image,
    )
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in out.apply}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_decode_pods_run_the_sidecar_on_the_pool_port_and_the_engine_behind_it():
    decode = children(PD)["Deployment/chat"]
    pod = decode["spec"]["template"]
    assert pod["metadata"]["labels"][c.ROLE_LABEL] == "decode"
    (sidecar,) = pod["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    assert sidecar["image"] == c.DEFAULT_SIDECAR_IMAGE
    assert sidecar["args"] == [
        "--port=8000",
        "--model-server-port=8200",
        "--kv-connector=nixlv2",
        "--secure-proxy=false",
        "--enable-ssrf-protection=true",
        "--pool-group=inference.networking.k8s.io",
        "--inference-pool=team-a/chat",
    ]
    assert sidecar["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    (server,) = pod["spec"]["containers"]
    assert flag(server["args"], "--port") == "8200"
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {
        "engine": 8200,
        "kv-events": 5557,
        "kv-replay": 5558,
        "nixl": 5600,
    }
    assert server["readinessProbe"]["httpGet"]["port"] == "engine"


def test_both_engines_take_the_nixl_connector_and_the_pod_ip_side_channel():
    out = children(PD)
    for name in ("Deployment/chat", "Deployment/chat-prefill"):
        server = out[name]["spec"]["template"]["spec"]["containers"][0]
        config = json.loads(flag(server["args"], "--kv-transfer-config"))
        assert config == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"kv_lease_duration": 30},
        }
        env = env_of(server)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"


def test_the_server_parser_takes_both_pools_arguments():
    out = children(PD)
    for name in ("Deployment/chat", "Deployment/chat-prefill"):
        args = out[name]["spec"]["template"]["spec"]["containers"][0]["args"]
        parsed = build_parser().parse_args(args)
        assert "NixlConnector" in str(parsed.kv_transfer_config)


def test_only_the_sidecar_gets_an_api_token_and_its_role_reads_the_pool():
    out = children(PD, sidecar_image="mirror.local/pd-sidecar:v0.10.0")
    spec = out["Deployment/chat"]["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "chat-pd-sidecar"
    sidecar, server = spec["initContainers"][0], spec["containers"][0]
    assert sidecar["image"] == "mirror.local/pd-sidecar:v0.10.0"
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert [m["mountPath"] for m in sidecar["volumeMounts"]] == [token]
    assert token not in [m["mountPath"] for m in server["volumeMounts"]]
    rules = out["Role/chat-pd-sidecar"]["rules"]
    assert {(r["apiGroups"][0], r["resources"][0]) for r in rules} == {
        ("", "pods"),
        ("inference.networking.k8s.io", "inferencepools"),
    }
    assert all(r["verbs"] == ["get", "list", "watch"] for r in rules)
    binding = out["RoleBinding/chat-pd-sidecar"]
    assert binding["subjects"][0]["name"] == "chat-pd-sidecar"


def test_the_prefill_pool_serves_directly_with_its_own_replicas_resources_and_flags():
    spec = {**PD, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}, "replicas": 3}
    prefill = children(spec)["Deployment/chat-prefill"]
    assert prefill["spec"]["replicas"] == 2  # prefill.replicas, not the autoscaled decode's
    selector = prefill["spec"]["selector"]["matchLabels"]
    assert selector[c.COMPONENT_LABEL] == "prefill"
    labels = prefill["spec"]["template"]["metadata"]["labels"]
    assert labels[c.ROLE_LABEL] == "prefill" and selector.items() <= labels.items()
    pod = prefill["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "serviceAccountName" not in pod
    server = pod["containers"][0]
    assert flag(server["args"], "--port") == "8000"
    assert server["args"][-4:] == ["--max-num-seqs", "64", "--max-num-batched-tokens", "8192"]
    limits = server["resources"]["limits"]
    assert limits == {"cpu": "8", "nvidia.com/gpu": "1"}  # cpu overridden, gpu inherited
    assert server["readinessProbe"]["httpGet"]["port"] == "http"


def test_one_pool_on_port_8000_selects_both_roles():
    out = children(PD)
    pool = out["InferencePool/chat"]["spec"]
    assert pool["targetPorts"] == [{"number": 8000}]
    for name in ("Deployment/chat", "Deployment/chat-prefill"):
        labels = out[name]["spec"]["template"]["metadata"]["labels"]
        assert pool["selector"]["matchLabels"].items() <= labels.items()
    # the plain Service reaches the decode pods only (their sidecar serves without a prefill)
    selector = out["Service/chat"]["spec"]["selector"]
    assert selector[c.ROLE_LABEL] == "decode"
    prefill_labels = out["Deployment/chat-prefill"]["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= prefill_labels.items()


def test_the_picker_disaggregates_with_a_profile_per_role():
    config = endpoint_picker_config(isvc(PD))
    types = [p["type"] for p in config["plugins"]]
    assert "single-profile-handler" not in types
    assert {"prefill-filter", "decode-filter", "always-disagg-pd-decider"} <= set(types)
    handler = next(p for p in config["plugins"] if p["type"] == "disagg-profile-handler")
    assert handler["parameters"] == {"deciders": {"prefill": "always-disagg-pd-decider"}}
    profiles = {
        p["name"]: [r["pluginRef"] for r in p["plugins"]] for p in config["schedulingProfiles"]
    }
    assert set(profiles) == {"prefill", "decode"}
    assert profiles["prefill"][0] == "prefill-filter" and profiles["decode"][0] == "decode-filter"
    assert profiles["prefill"][1:] == profiles["decode"][1:]
    assert profiles["decode"][-1] == "max-score-picker"


def test_without_prefill_nothing_changes_and_the_prefill_objects_go():
    spec = {"model": MODEL, "router": {"enabled": True}}
    out = desired_children(isvc(spec), "octavo:1", False, inference_pools_served=True)
    assert out.remove_prefill == [
        *SIDECAR_RBAC,
        ChildRef("apps/v1", "Deployment", "chat-prefill"),
        ChildRef("policy/v1", "PodDisruptionBudget", "chat-prefill"),
    ]
    decode = next(o for o in out.apply if o["metadata"]["name"] == "chat")
    assert c.ROLE_LABEL not in decode["spec"]["template"]["metadata"]["labels"]
    assert "initContainers" not in decode["spec"]["template"]["spec"]
    config = endpoint_picker_config(isvc(spec))
    assert [p["name"] for p in config["schedulingProfiles"]] == ["default"]


def test_network_policy_lets_the_pools_reach_each_other_on_any_port():
    ingress = children(PD)["NetworkPolicy/chat"]["spec"]["ingress"]
    own = {
        "podSelector": {"matchLabels": {c.NAME_LABEL: "octavo-server", c.INSTANCE_LABEL: "chat"}}
    }
    assert {"from": [own], "ports": [{"protocol": "TCP"}]} in ingress


def deployment_seen(name: str, replicas: int, ready: int) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": name, "generation": 1, "resourceVersion": "5"},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": 1,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
        },
    }


def test_status_reports_both_pools():
    observed = Observed(
        pools_served=True,
        deployment=deployment_seen("chat", 1, 1),
        prefill=deployment_seen("chat-prefill", 2, 1),
    )
    fields, conds = compute(isvc(PD), observed)
    by_type = {cond.type: cond for cond in conds}
    assert by_type["Ready"].status and by_type["PrefillReady"].status
    assert "1/2" in by_type["PrefillReady"].message
    assert fields["prefill"] == {"deployment": "chat-prefill", "replicas": 2, "readyReplicas": 1}
    assert fields["selector"].endswith(f",{c.ROLE_LABEL}=decode")  # what the HPA counts
    waiting = Observed(pools_served=True, prefill=deployment_seen("chat-prefill", 2, 0))
    _, conds = compute(isvc(PD), waiting)
    prefill = next(cond for cond in conds if cond.type == "PrefillReady")
    assert (prefill.status, prefill.reason) == (False, "ReplicasNotReady")


def test_a_bad_prefill_is_degraded_and_the_decode_pool_serves_alone():
    bad = {**PD, "router": {"enabled": False}}
    service = isvc(bad)
    assert service.prefill_problem is not None and "router.enabled" in service.prefill_problem
    out = desired_children(service, "octavo:1", False, inference_pools_served=True)
    assert ChildRef("apps/v1", "Deployment", "chat-prefill") in out.remove_prefill
    decode = next(o for o in out.apply if o["metadata"]["name"] == "chat")
    assert "initContainers" not in decode["spec"]["template"]["spec"]
    _, conds = compute(service, Observed(deployment=deployment_seen("chat", 1, 1)))
    by_type = {cond.type: cond for cond in conds}
    assert (by_type["Degraded"].status, by_type["Degraded"].reason) == (True, "PrefillInvalid")
    assert not by_type["Ready"].status  # an Event follows the transition (events.py)
    assert by_type["PrefillReady"].reason == "PrefillInvalid"


def test_other_bad_prefills_say_what_to_change():
    cases = {
        "engine.nodes 1": {"engine": {"nodes": 2, "tensorParallelSize": 2}},
        "minReplicas": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
        "--kv-transfer-config": {"engine": {"extraArgs": ["--kv-transfer-config={}"]}},
    }
    for expected, change in cases.items():
        problem = isvc({**PD, **change}).prefill_problem
        assert problem is not None and expected in problem, (expected, problem)
    assert sets_flag(("--kv-transfer",), "--kv-transfer-config")  # argparse's abbreviation
    assert sets_flag(("--kv_transfer_config={}",), "--kv-transfer-config")  # vLLM's spelling
    assert sets_flag(("--kv-transfer-config.kv_role", "kv_both"), "--kv-transfer-config")
    assert not sets_flag(("--kv-cache-dtype", "fp8"), "--kv-transfer-config")


class FakeApiServer(Kube):
    """The real Kube over an in-memory apiserver: GET, server-side apply (PATCH) and DELETE
    with preconditions, on objects keyed by their path."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.objects = objects
        self.deleted: list[str] = []

    def served(self, group_version: str, plural: str) -> bool:
        return plural == "inferencepools"

    def call(self, method: str, path: str, body: Any = None, *_: Any, **__: Any) -> dict:
        found = self.objects.get(path)
        if method == "PATCH":
            meta = {"uid": f"uid-of-{path}", **body["metadata"]}
            self.objects[path] = {**body, "metadata": meta}
            return self.objects[path]
        if found is None:
            raise client.ApiException(status=404, reason="Not Found")
        if method == "DELETE":
            if body["preconditions"]["uid"] != found["metadata"]["uid"]:
                raise client.ApiException(status=409, reason="Conflict")
            self.deleted.append(path)
            del self.objects[path]
        return found


def owned_by(kind: str, name: str, owner_uid: str | None, owner: str = "x") -> dict[str, Any]:
    refs = [{"kind": "InferenceService", "name": owner, "uid": owner_uid, "controller": True}]
    meta = {"name": name, "uid": f"uid-{name}", "ownerReferences": refs if owner_uid else []}
    return {"kind": kind, "metadata": meta}


def path_of(kind: str, name: str) -> str:
    rbac = "rbac.authorization.k8s.io/v1"
    api_version = {"Deployment": "apps/v1", "ServiceAccount": "v1", "Role": rbac}[kind]
    return object_path(api_version, kind, "team-a", name)


def test_reconcile_records_each_deployment_and_removes_the_prefill_pool_when_off():
    kube = FakeApiServer({})
    controller = Controller(kube, Settings())
    applied = controller.reconcile(body(PD), trigger="create")
    assert applied.deployment["metadata"]["name"] == "chat"
    assert applied.prefill["metadata"]["name"] == "chat-prefill"
    assert applied.picker["metadata"]["name"] == "chat-epp"
    controller.reconcile(body({"model": MODEL, "router": {"enabled": True}}), trigger="update")
    assert {path_of("Deployment", "chat-prefill"), path_of("Role", "chat-pd-sidecar")} <= set(
        kube.deleted
    )


def test_the_status_tells_the_two_deployments_apart_in_the_index():
    service = isvc(PD)
    store = [deployment_seen("chat-prefill", 2, 2), deployment_seen("chat", 1, 1)]
    indexes = {"deployment_index": {("team-a", "chat"): store}}
    assert workload(service, None, indexes)["metadata"]["name"] == "chat"
    assert named(store, "chat-prefill")["spec"]["replicas"] == 2


# --- finding 23: spec.prefill.kvTransfer ------------------------------------------------


def test_kv_transfer_settings_reach_both_pools_and_the_server_parser():
    spec = {**PD, "prefill": {**PD["prefill"], "kvTransfer": {"failurePolicy": "fail"}}}
    spec["prefill"]["kvTransfer"]["leaseSeconds"] = 90
    out = children(spec)
    for name in ("Deployment/chat", "Deployment/chat-prefill"):
        args = out[name]["spec"]["template"]["spec"]["containers"][0]["args"]
        config = json.loads(flag(args, "--kv-transfer-config"))
        assert config["kv_load_failure_policy"] == "fail"
        assert config["kv_connector_extra_config"] == {"kv_lease_duration": 90}
        server = KVTransferConfig.parse(build_parser().parse_args(args).kv_transfer_config)
        server.check()  # what the engine does at start-up
        assert (server.lease_seconds, server.recomputes_on_failure) == (90.0, False)
    bad = {**PD, "prefill": {"kvTransfer": {"failurePolicy": "retry"}}}
    assert "failurePolicy" in (isvc(bad).prefill_problem or "")
    bad = {**PD, "prefill": {"kvTransfer": {"leaseSeconds": 0}}}
    assert "leaseSeconds" in (isvc(bad).prefill_problem or "")


# --- finding 7: disruption budgets per pool ---------------------------------------------


def test_the_budget_counts_decode_pods_and_the_prefill_pool_has_its_own():
    spec = {**PD, "replicas": 2, "disruptionBudget": {"minAvailable": 2}}
    out = children(spec)
    decode = out["PodDisruptionBudget/chat"]["spec"]
    assert decode["minAvailable"] == 2
    assert decode["selector"]["matchLabels"][c.ROLE_LABEL] == "decode"
    prefill = out["PodDisruptionBudget/chat-prefill"]
    assert prefill["spec"]["maxUnavailable"] == 1
    assert prefill["spec"]["selector"]["matchLabels"][c.ROLE_LABEL] == "prefill"
    assert prefill["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    prefill_pods = out["Deployment/chat-prefill"]["spec"]["template"]["metadata"]["labels"]
    assert not decode["selector"]["matchLabels"].items() <= prefill_pods.items()
    no_budget = desired_children(isvc(PD), "octavo:1", False, inference_pools_served=True)
    assert ChildRef("policy/v1", "PodDisruptionBudget", "chat-prefill") in no_budget.remove


# --- finding 17: the prefill pods are scraped --------------------------------------------


def test_a_pod_monitor_scrapes_the_prefill_pods_where_the_api_is_served():
    spec = {**PD, "monitoring": {"serviceMonitor": True}}
    out = desired_children(isvc(spec), "octavo:1", True, True, pod_monitors_served=True)
    (monitor,) = [o for o in out.apply if o["kind"] == "PodMonitor"]
    assert monitor["metadata"]["name"] == "chat-prefill"
    assert monitor["spec"]["selector"]["matchLabels"][c.ROLE_LABEL] == "prefill"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    prefill = next(o for o in out.apply if o["metadata"]["name"] == "chat-prefill")
    ports = prefill["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in ports
    plain = {"model": MODEL, "monitoring": {"serviceMonitor": True}}
    off = desired_children(isvc(plain), "octavo:1", True, pod_monitors_served=True)
    assert ChildRef("monitoring.coreos.com/v1", "PodMonitor", "chat-prefill") in off.remove_prefill


# --- finding 6: objects of another owner under the prefill names ------------------------


def test_resume_removes_only_the_prefill_objects_this_service_controls():
    objects = {
        path_of("Deployment", "chat-prefill"): owned_by("Deployment", "chat-prefill", "uid-2"),
        path_of("ServiceAccount", "chat-pd-sidecar"): owned_by("ServiceAccount", "x", None),
        path_of("Role", "chat-pd-sidecar"): owned_by("Role", "chat-pd-sidecar", "uid-1"),
    }
    kube = FakeApiServer(objects)
    spec = {"model": MODEL, "router": {"enabled": True}}
    Controller(kube, Settings()).reconcile(body(spec), trigger="resume")
    assert kube.deleted == [path_of("Role", "chat-pd-sidecar")]  # ours (uid-1) only
    assert path_of("Deployment", "chat-prefill") in kube.objects
    assert path_of("ServiceAccount", "chat-pd-sidecar") in kube.objects


def test_a_prefill_name_of_another_owner_is_degraded_and_left_alone():
    taken = owned_by("Deployment", "chat-prefill", "uid-2")
    kube = FakeApiServer({path_of("Deployment", "chat-prefill"): taken})
    controller = Controller(kube, Settings())
    applied = controller.reconcile(body(PD), trigger="create")
    assert "Deployment team-a/chat-prefill" in (applied.prefill_conflict or "")
    assert kube.objects[path_of("Deployment", "chat-prefill")] is taken  # not applied over
    assert path_of("ServiceAccount", "chat-pd-sidecar") not in kube.objects
    decode = kube.objects[path_of("Deployment", "chat")]["spec"]["template"]["spec"]
    assert "initContainers" not in decode  # the decode pool serves alone, no sidecar
    observed = Observed(
        deployment=deployment_seen("chat", 1, 1), prefill_conflict=applied.prefill_conflict
    )
    _, conds = compute(isvc(PD), observed)
    by_type = {cond.type: cond for cond in conds}
    assert (by_type["Degraded"].status, by_type["Degraded"].reason) == (True, "PrefillNameTaken")
    assert "belongs to InferenceService x" in by_type["Degraded"].message
    assert by_type["PrefillReady"].reason == "PrefillNameTaken"
    event = [(cond.type, cond.healthy) for cond in transitions([], conds)]  # a Warning Event
    assert ("Degraded", False) in event


def test_an_inference_service_named_like_the_prefill_pool_wins_the_name():
    namesake = object_path(c.API_VERSION, c.KIND, "team-a", "chat-prefill")
    kube = FakeApiServer({namesake: {"metadata": {"name": "chat-prefill", "uid": "uid-2"}}})
    applied = Controller(kube, Settings()).reconcile(body(PD), trigger="create")
    assert "InferenceService chat-prefill exists" in (applied.prefill_conflict or "")
    assert path_of("Deployment", "chat-prefill") not in kube.objects
    freed = FakeApiServer({})
    assert Controller(freed, Settings()).reconcile(body(PD), "create").prefill_conflict is None
    assert path_of("Deployment", "chat-prefill") in freed.objects


def test_the_prefill_pool_of_an_earlier_service_of_the_same_name_is_adopted():
    leftover = owned_by("Deployment", "chat-prefill", "uid-0", owner="chat")  # not collected yet
    kube = FakeApiServer({path_of("Deployment", "chat-prefill"): leftover})
    applied = Controller(kube, Settings()).reconcile(body(PD), trigger="create")
    assert applied.prefill_conflict is None
    adopted = kube.objects[path_of("Deployment", "chat-prefill")]["metadata"]
    assert adopted["ownerReferences"][0]["uid"] == "uid-1"
