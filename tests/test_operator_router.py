"""spec.router: the InferencePool, the llm-d router's endpoint picker (Deployment, Service,
EndpointPickerConfig, RBAC), the servers' KV events, and the RouterReady status."""

from __future__ import annotations

import json
from typing import Any

import yaml

from octavo.cli import build_parser
from octavo_operator import constants as c
from octavo_operator.api.crd import custom_resource_definition
from octavo_operator.builders.children import desired_children
from octavo_operator.builders.container import server_args, server_container
from octavo_operator.builders.picker_config import endpoint_picker_config
from octavo_operator.conditions import transitions
from octavo_operator.handlers import deployment_index, picker_index
from octavo_operator.picker_wakeup import queued_requests, wake_if_requests_wait
from octavo_operator.rbac import namespaced_rules
from octavo_operator.reconcile import Controller, Settings
from octavo_operator.status import Observed, compute

from isvc_factories import body, isvc

SELECTOR = {c.NAME_LABEL: "octavo-server", c.INSTANCE_LABEL: "chat"}
ROUTER = {"enabled": True}
MODEL = {"uri": "hf://org/name", "servedName": "org/name"}
ROUTED = {"model": MODEL, "router": ROUTER}


def children(spec: dict[str, Any] | None = None, served: bool = True) -> dict[str, dict]:
    """The applied children by "Kind/name"."""
    out = desired_children(
        isvc(spec if spec is not None else ROUTED),
        "octavo:1",
        service_monitors_served=False,
        inference_pools_served=served,
    )
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in out.apply}


def picker_containers(spec: dict[str, Any] | None = None) -> dict[str, dict]:
    pod = children(spec)["Deployment/chat-epp"]["spec"]["template"]["spec"]
    return {ctr["name"]: ctr for ctr in pod["containers"]}


def picker_config(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The EndpointPickerConfig as the picker reads it: parsed from the ConfigMap's YAML."""
    config_map = children(spec)["ConfigMap/chat-epp"]
    return yaml.safe_load(config_map["data"]["epp-config.yaml"])


def plugins_by_type(config: dict[str, Any]) -> dict[str, dict]:
    return {p["type"]: p.get("parameters", {}) for p in config["plugins"]}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# --- off: nothing ------------------------------------------------------------------------


def test_router_off_creates_nothing_and_leaves_the_server_alone():
    applied = children({"model": MODEL})
    assert sorted(applied) == ["Deployment/chat", "Service/chat"]
    container = server_container(isvc({"model": MODEL}), "octavo:1")
    assert "--kv-events-config" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["http"]
    assert all(e["name"] != "POD_IP" for e in container["env"])


def test_router_off_removes_the_pool_only_where_its_api_is_served():
    def removed(served: bool) -> list[str]:
        out = desired_children(isvc(), "octavo:1", False, inference_pools_served=served)
        return [f"{r.kind}/{r.name}" for r in out.remove if r.name.startswith("chat")]

    picker = ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"]
    assert [f"{k}/chat-epp" for k in picker] == [r for r in removed(False) if "epp" in r]
    assert "InferencePool/chat" in removed(True) and "InferencePool/chat" not in removed(False)


def test_without_the_inference_pool_api_nothing_is_applied_or_removed():
    out = desired_children(isvc(ROUTED), "octavo:1", False, inference_pools_served=False)
    # The servers publish KV events all the same: the policy closes their ports to others.
    assert [o["kind"] for o in out.apply] == ["Deployment", "Service", "NetworkPolicy"]
    assert all(not r.name.endswith("-epp") for r in out.remove)


# --- the pool ----------------------------------------------------------------------------


def test_pool_selects_the_server_pods_on_port_8000_through_the_picker():
    pool = children()["InferencePool/chat"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "chat-epp",
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }
    closed = {"model": MODEL, "router": {"enabled": True, "picker": {"failureMode": "FailClose"}}}
    assert children(closed)["InferencePool/chat"]["spec"]["endpointPickerRef"]["failureMode"] == (
        "FailClose"
    )


def test_the_server_selector_never_picks_up_the_picker_pods():
    applied = children()
    picker_pods = applied["Deployment/chat-epp"]["spec"]["template"]["metadata"]["labels"]
    server_pods = applied["Deployment/chat"]["spec"]["template"]["metadata"]["labels"]
    assert not SELECTOR.items() <= picker_pods.items()
    assert SELECTOR.items() <= server_pods.items()
    assert applied["Service/chat-epp"]["spec"]["selector"].items() <= picker_pods.items()
    assert c.MANAGED_BY_LABEL not in picker_pods  # not in the operator's pod index either


def test_every_router_child_is_owned_by_the_service():
    applied = children()
    router_children = [o for name, o in applied.items() if name.endswith("-epp")]
    router_children.append(applied["InferencePool/chat"])
    assert len(router_children) == 7
    for obj in router_children:
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] == "InferenceService" and owner["uid"] == "uid-1"
        assert owner["controller"] is True
        assert meta["labels"][c.INSTANCE_LABEL] == "chat"  # drift finds the owner by it
        assert meta["labels"][c.MANAGED_BY_LABEL] == c.MANAGED_BY  # and watches it


# --- the picker --------------------------------------------------------------------------


def test_picker_runs_the_pinned_epp_with_upstream_flags_and_grpc_probes():
    epp = picker_containers()["epp"]
    assert epp["image"] == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
    args = epp["args"]
    assert flag(args, "--pool-name") == "chat"
    assert flag(args, "--pool-namespace") == "team-a"
    assert flag(args, "--pool-group") == "inference.networking.k8s.io"
    assert flag(args, "--config-file") == "/config/epp-config.yaml"
    assert flag(args, "--grpc-port") == "9002"
    assert flag(args, "--grpc-health-port") == "9003"
    assert flag(args, "--metrics-port") == "9090"
    assert "--metrics-endpoint-auth=false" in args and "--secure-serving=true" in args
    assert "--ha-enable-leader-election" not in args
    assert epp["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert epp["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
    deployment = children()["Deployment/chat-epp"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "chat-epp"
    mounts = {m["mountPath"]: m["name"] for m in epp["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/config"]]["configMap"] == {"name": "chat-epp"}


def test_picker_image_replicas_and_tls_are_configurable():
    picker = {"image": "registry.local/epp:v0.10.0", "replicas": 2, "secureServing": False}
    spec = {"model": MODEL, "router": {"enabled": True, "picker": picker}}
    epp = picker_containers(spec)["epp"]
    assert epp["image"] == "registry.local/epp:v0.10.0"
    assert "--ha-enable-leader-election" in epp["args"]
    assert "--secure-serving=false" in epp["args"]
    assert children(spec)["Deployment/chat-epp"]["spec"]["replicas"] == 2


def test_picker_service_serves_ext_proc_and_metrics():
    ports = {p["name"]: p for p in children()["Service/chat-epp"]["spec"]["ports"]}
    assert ports["grpc-ext-proc"]["port"] == 9002
    assert ports["grpc-ext-proc"]["appProtocol"] == "kubernetes.io/h2c"
    assert ports["http-metrics"]["port"] == 9090


def test_tokenizer_sidecar_renders_with_the_servers_image_and_model():
    spec = {**ROUTED, "model": {**MODEL, "revision": "v2"}, "image": "mine:3"}
    sidecar = picker_containers(spec)["tokenizer"]
    assert sidecar["image"] == "mine:3"
    assert sidecar["command"] == ["octavo"]
    assert sidecar["args"] == [
        "launch",
        "render",
        "hf://org/name",
        "--revision",
        "v2",
        "--served-model-name",
        "org/name",
        "--port",
        "8000",
    ]


def test_tokenizer_sidecar_has_default_resources_unless_given():
    """It takes end users' bodies: without tokenizerResources it still gets requests and
    limits (a flood is bounded by its own memory limit, not the node's)."""
    default = picker_containers()["tokenizer"]["resources"]
    assert default == c.TOKENIZER_RESOURCES
    assert default["limits"]["memory"] and default["requests"]["memory"]
    given = {"limits": {"memory": "8Gi"}}
    spec = {**ROUTED, "router": {**ROUTER, "picker": {"tokenizerResources": given}}}
    assert picker_containers(spec)["tokenizer"]["resources"] == given


def test_tokenizer_sidecar_mounts_a_pvc_model_read_only():
    spec = {"model": {"uri": "pvc://weights/llama"}, "router": ROUTER}
    deployment = children(spec)["Deployment/chat-epp"]["spec"]["template"]["spec"]
    sidecar = {ctr["name"]: ctr for ctr in deployment["containers"]}["tokenizer"]
    assert sidecar["args"][2] == "/models/weights/llama"
    assert {"name": "model", "mountPath": "/models/weights", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    claim = {"claimName": "weights", "readOnly": True}
    assert {"name": "model", "persistentVolumeClaim": claim} in deployment["volumes"]


# --- the EndpointPickerConfig -------------------------------------------------------------


def test_config_wires_the_precise_prefix_pipeline_and_weighted_scorers():
    config = picker_config()
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = plugins_by_type(config)
    assert plugins["token-producer"] == {
        "modelName": "org/name",
        "vllm": {"url": "http://localhost:8000"},
    }
    producer = plugins["precise-prefix-cache-producer"]
    assert producer["tokenProcessorConfig"] == {"blockSize": 16}
    assert producer["kvEventsConfig"] == {
        "topicFilter": "kv@",
        "discoverPods": True,
        "podDiscoveryConfig": {"socketPort": 5557, "replaySocketPort": 5558},
    }
    assert plugins["prefix-cache-scorer"] == {
        "prefixMatchInfoProducerName": "precise-prefix-cache-producer"
    }
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights == {
        "prefix-cache-scorer": 3,
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "lora-affinity-scorer": 1,
        "max-score-picker": None,
    }
    sources = {s["pluginRef"]: s["extractors"] for s in config["dataLayer"]["sources"]}
    assert sources["endpoint-notification-source"] == [
        {"pluginRef": "precise-prefix-cache-producer"}
    ]
    assert sources["metrics-data-source"] == [{"pluginRef": "core-metrics-extractor"}]
    referenced = {p["pluginRef"] for p in profile["plugins"]} | set(sources)
    assert referenced <= set(plugins), "every reference names a declared plugin"


def test_weights_and_block_size_come_from_the_spec():
    router = {
        "enabled": True,
        "scorers": {"precisePrefixCache": 5, "queue": 0.5, "kvCacheUtilization": 0},
        "blockSize": 64,
    }
    config = picker_config({"model": MODEL, "engine": {"blockSize": 32}, "router": router})
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights["prefix-cache-scorer"] == 5 and weights["queue-scorer"] == 0.5
    assert "kv-cache-utilization-scorer" not in weights
    assert "kv-cache-utilization-scorer" not in plugins_by_type(config)
    producer = plugins_by_type(config)["precise-prefix-cache-producer"]
    assert producer["tokenProcessorConfig"]["blockSize"] == 64
    engine_block = picker_config({"model": MODEL, "engine": {"blockSize": 32}, "router": ROUTER})
    producer = plugins_by_type(engine_block)["precise-prefix-cache-producer"]
    assert producer["tokenProcessorConfig"]["blockSize"] == 32


def test_without_the_prefix_scorer_no_token_or_kv_event_plugins_run():
    router = {"enabled": True, "scorers": {"precisePrefixCache": 0}}
    config = endpoint_picker_config(isvc({"model": MODEL, "router": router}))
    types = set(plugins_by_type(config))
    assert not types & {"token-producer", "precise-prefix-cache-producer", "prefix-cache-scorer"}
    assert [s["pluginRef"] for s in config["dataLayer"]["sources"]] == ["metrics-data-source"]


# --- the servers' KV events --------------------------------------------------------------


def test_servers_publish_kv_events_where_the_picker_subscribes():
    spec = {"model": MODEL, "router": {"enabled": True, "kvEventsPort": 6000}}
    container = server_container(isvc(spec), "octavo:1")
    events = json.loads(flag(container["args"], "--kv-events-config"))
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:6000",
        "replay_endpoint": "tcp://*:6001",
        "topic": "kv@$(POD_IP)@org/name",  # the router's kv@<pod>@<model>, model = served
    }
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "kv-events": 6000, "kv-replay": 6001}
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    discovery = plugins_by_type(picker_config(spec))["precise-prefix-cache-producer"]
    assert discovery["kvEventsConfig"]["podDiscoveryConfig"] == {
        "socketPort": 6000,
        "replaySocketPort": 6001,
    }


def test_the_server_parser_takes_the_kv_events_flag():
    parsed = build_parser().parse_args(server_args(isvc(ROUTED)))
    assert "kv@" in str(parsed.kv_events_config)


# --- RBAC --------------------------------------------------------------------------------


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for r in rules
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }


def test_picker_role_grants_what_the_epp_reads_and_leases_only_with_replicas():
    role = children()["Role/chat-epp"]
    granted = rule_set(role["rules"])
    assert {("", "pods", v) for v in ("get", "list", "watch")} <= granted
    assert ("inference.networking.k8s.io", "inferencepools", "watch") in granted
    assert ("llm-d.ai", "inferenceobjectives", "list") in granted
    assert not any(g == "coordination.k8s.io" for g, _, _ in granted)
    assert not any(v in ("create", "delete", "patch") for g, _, v in granted if g != "")
    spec = {"model": MODEL, "router": {"enabled": True, "picker": {"replicas": 3}}}
    assert ("coordination.k8s.io", "leases", "update") in rule_set(
        children(spec)["Role/chat-epp"]["rules"]
    )
    binding = children()["RoleBinding/chat-epp"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "chat-epp",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-epp", "namespace": "team-a"}
    ]


def test_the_operator_holds_every_right_it_grants_and_manages_the_new_kinds():
    spec = {"model": MODEL, "router": {"enabled": True, "picker": {"replicas": 2}}}
    operator = rule_set(namespaced_rules())
    assert rule_set(children(spec)["Role/chat-epp"]["rules"]) <= operator  # no escalation
    for group, resource in [
        ("inference.networking.k8s.io", "inferencepools"),
        ("", "serviceaccounts"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("apps", "deployments"),
        ("", "services"),
        ("", "configmaps"),
    ]:
        for verb in ("create", "patch", "delete", "watch"):
            assert (group, resource, verb) in operator, (group, resource, verb)


# --- the CRD -----------------------------------------------------------------------------


def router_schema() -> dict[str, Any]:
    root = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root["properties"]["spec"]


def test_crd_router_is_off_by_default_with_non_negative_weights():
    spec = router_schema()
    router = spec["properties"]["router"]
    assert router["default"]["enabled"] is False
    for scorer in router["properties"]["scorers"]["properties"].values():
        assert scorer["minimum"] == 0
    assert router["properties"]["picker"]["properties"]["failureMode"]["enum"] == [
        "FailOpen",
        "FailClose",
    ]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("--kv-events-config" in r and "self.router.enabled" in r for r in rules)
    status = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "router" in status["properties"]["status"]["properties"]


# --- status ------------------------------------------------------------------------------


def picker_deployment(wanted: int, available: int) -> dict[str, Any]:
    return {"spec": {"replicas": wanted}, "status": {"availableReplicas": available}}


def router_condition(**observed: Any):
    fields, conds = compute(isvc(ROUTED), Observed(applied_generation=3, **observed))
    by_type = {cond.type: cond for cond in conds}
    return fields, by_type["RouterReady"]


def test_status_reports_the_pool_and_the_pickers_readiness():
    fields, cond = router_condition(pools_served=True, picker=picker_deployment(1, 1))
    assert cond.status and cond.reason == "PickerReady"
    assert "InferencePool chat" in cond.message and "chat-epp" in cond.message
    assert fields["router"] == {
        "inferencePool": "chat",
        "endpointPicker": "chat-epp",
        "pickerReplicas": 1,
        "pickerAvailableReplicas": 1,
    }
    _, cond = router_condition(pools_served=True, picker=picker_deployment(1, 0))
    assert not cond.status and cond.reason == "PickerNotReady"
    _, cond = router_condition(pools_served=True)
    assert not cond.status and cond.reason == "Creating"


def test_a_missing_inference_pool_api_is_a_condition_and_an_event_at_once():
    _, cond = router_condition(pools_served=False)
    assert not cond.status and cond.reason == "InferencePoolAPIMissing"
    assert "inference.networking.k8s.io/v1" in cond.message
    assert transitions([], [cond]) == [cond]  # first seen: an Event, not silence


def test_no_router_condition_or_field_without_spec_router():
    fields, conds = compute(isvc({"model": MODEL}), Observed(applied_generation=3))
    assert "router" not in fields
    assert "RouterReady" not in {cond.type for cond in conds}


# --- reconcile and handlers --------------------------------------------------------------


class FakeKube:
    """Serves the InferencePool API or not; records applies, deletes and status patches."""

    def __init__(self, pools: bool):
        self.pools = pools
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.patches: list[dict[str, Any]] = []

    def served(self, group_version: str, plural: str) -> bool:
        return self.pools and plural == "inferencepools"

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return obj

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str | None = None
    ) -> bool:
        self.deleted.append((kind, name))
        return True

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return patch


def test_reconcile_without_the_api_applies_no_router_child_and_does_not_crash():
    kube = FakeKube(pools=False)
    applied = Controller(kube, Settings()).reconcile(body(ROUTED), trigger="create")
    assert applied.error is None and applied.pools_served is False
    assert [o["kind"] for o in kube.applied] == ["Deployment", "Service", "NetworkPolicy"]


def test_reconcile_applies_the_router_children_and_removes_them_when_turned_off():
    kube = FakeKube(pools=True)
    controller = Controller(kube, Settings(picker_image="mirror.local/epp:v0.10.0"))
    applied = controller.reconcile(body(ROUTED), trigger="create")
    assert ("InferencePool", "chat") in applied.versions
    assert applied.deployment["metadata"]["name"] == "chat"  # the servers', not the picker's
    assert applied.picker["metadata"]["name"] == "chat-epp"
    epp = next(
        o for o in kube.applied if o["metadata"]["name"] == "chat-epp" and o["kind"] == "Deployment"
    )
    assert epp["spec"]["template"]["spec"]["containers"][0]["image"] == "mirror.local/epp:v0.10.0"
    controller.reconcile(body({"model": MODEL}), trigger="update")
    assert {("InferencePool", "chat"), ("Deployment", "chat-epp"), ("Role", "chat-epp")} <= set(
        kube.deleted
    )


def test_status_router_is_dropped_when_the_router_is_turned_off():
    kube = FakeKube(pools=True)
    controller = Controller(kube, Settings())
    routed = body(ROUTED)
    controller.write_status(routed, Observed(pools_served=True), post_events=False)
    assert kube.patches[-1]["status"]["router"]["inferencePool"] == "chat"
    controller.write_status(body({"model": MODEL}), Observed(), post_events=False)
    assert kube.patches[-1]["status"]["router"] is None  # a merge patch removes it


def test_the_picker_deployment_has_its_own_index():
    labels = {c.INSTANCE_LABEL: "chat", c.COMPONENT_LABEL: "router"}
    picker = {"metadata": {"name": "chat-epp"}, "spec": {"replicas": 1}, "status": {}}
    assert deployment_index(namespace="team-a", labels=labels, body=picker) == {}
    assert list(picker_index(namespace="team-a", labels=labels, body=picker)) == [
        ("team-a", "chat")
    ]
    server = {**labels, c.COMPONENT_LABEL: "server"}
    assert picker_index(namespace="team-a", labels=server, body=picker) == {}
    assert list(deployment_index(namespace="team-a", labels=server, body=picker)) == [
        ("team-a", "chat")
    ]


# --- network policy ----------------------------------------------------------------------


def test_network_policy_admits_the_picker_to_metrics_and_kv_events():
    spec = {**ROUTED, "networkPolicy": {"enabled": True}}
    policy = children(spec)["NetworkPolicy/chat"]
    picker_rule = policy["spec"]["ingress"][-1]
    assert picker_rule["from"] == [
        {"podSelector": {"matchLabels": {c.NAME_LABEL: "octavo-router", c.INSTANCE_LABEL: "chat"}}}
    ]
    assert [p["port"] for p in picker_rule["ports"]] == [8000, 5557, 5558]
    plain = children({"model": MODEL, "networkPolicy": {"enabled": True}})["NetworkPolicy/chat"]
    assert len(plain["spec"]["ingress"]) == 1


# --- scale from zero through the pool ------------------------------------------------------

TO_ZERO = {**ROUTED, "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}
QUEUE_TEXT = """\
# HELP llm_d_epp_flow_control_queue_size Current number of requests actively held.
# TYPE llm_d_epp_flow_control_queue_size gauge
llm_d_epp_flow_control_queue_size{fairness_id="a",priority="0",inference_pool="chat"} 2
llm_d_epp_flow_control_queue_size{fairness_id="b",priority="0",inference_pool="chat"} 1
# TYPE llm_d_epp_flow_control_pool_saturation gauge
llm_d_epp_flow_control_pool_saturation{inference_pool="chat"} 1
"""


def test_scale_to_zero_turns_on_the_pickers_flow_control_queue():
    config = picker_config(TO_ZERO)
    assert config["featureGates"] == ["flowControl"]
    assert config["flowControl"] == {"defaultRequestTTL": "600s"}
    assert "featureGates" not in picker_config()


def test_queued_requests_sum_every_flow():
    assert queued_requests(QUEUE_TEXT) == 3
    assert queued_requests("# nothing here\n") == 0


class PickerPodsKube(FakeKube):
    """One ready picker pod; /scale patches are recorded."""

    def __init__(self) -> None:
        super().__init__(pools=True)
        self.listed: list[str] = []

    def call(self, method: str, path: str, body: Any = None, query: Any = None) -> dict:
        self.listed.append(dict(query or [])["labelSelector"])
        ready = {"type": "Ready", "status": "True"}
        pod = {
            "metadata": {"name": "chat-epp-1"},
            "status": {"podIP": "10.0.0.9", "conditions": [ready]},
        }
        return {"items": [pod]}


def at_zero_body(spec: dict[str, Any]) -> dict[str, Any]:
    return body({**spec, "replicas": 0}, resourceVersion="41")


def test_requests_held_by_the_picker_wake_the_service_at_zero():
    kube, scraped = PickerPodsKube(), []

    def scrape(url: str) -> str:
        scraped.append(url)
        return QUEUE_TEXT

    assert wake_if_requests_wait(kube, at_zero_body(TO_ZERO), scrape) is True
    assert scraped == ["http://10.0.0.9:9090/metrics"]
    assert kube.listed == ["app.kubernetes.io/name=octavo-router,app.kubernetes.io/instance=chat"]
    assert kube.patches == [{"metadata": {"resourceVersion": "41"}, "spec": {"replicas": 1}}]


def test_no_wake_without_held_requests_or_when_not_at_zero():
    kube = PickerPodsKube()
    assert not wake_if_requests_wait(kube, at_zero_body(TO_ZERO), lambda url: "")
    assert not wake_if_requests_wait(kube, at_zero_body(TO_ZERO), lambda url: None)
    running = body({**TO_ZERO, "replicas": 1}, resourceVersion="41")
    assert not wake_if_requests_wait(kube, running, lambda url: QUEUE_TEXT)
    unrouted = at_zero_body({"model": MODEL, "autoscaling": TO_ZERO["autoscaling"]})
    assert not wake_if_requests_wait(kube, unrouted, lambda url: QUEUE_TEXT)
    assert kube.patches == []
