"""Service, ServiceMonitor, PodDisruptionBudget, HorizontalPodAutoscaler, cache claim, and
which optional children a spec asks for."""

from __future__ import annotations

from octavo_operator.builders.autoscaler import horizontal_pod_autoscaler, quantity
from octavo_operator.builders.cache_claim import cache_claim
from octavo_operator.builders.children import ChildRef, desired_children
from octavo_operator.builders.disruption_budget import pod_disruption_budget
from octavo_operator.builders.service import service
from octavo_operator.builders.service_monitor import service_monitor

from isvc_factories import isvc

SELECTOR = {"app.kubernetes.io/name": "octavo-server", "app.kubernetes.io/instance": "chat"}


def test_service_targets_the_named_port():
    svc = service(isvc())
    assert svc["metadata"]["name"] == "chat"
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert svc["spec"]["selector"] == SELECTOR
    assert svc["spec"]["type"] == "ClusterIP"
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("http", 8000, "http")


def test_service_monitor_scrapes_metrics():
    sm = service_monitor(isvc({"monitoring": {"serviceMonitor": True, "interval": "30s"}}))
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["kind"] == "ServiceMonitor"
    assert sm["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "30s")


def test_disruption_budget_takes_exactly_the_given_field():
    pdb = pod_disruption_budget(isvc({"disruptionBudget": {"maxUnavailable": 1}}))
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"] == {"matchLabels": SELECTOR}
    pdb = pod_disruption_budget(isvc({"disruptionBudget": {"minAvailable": "50%"}}))
    assert pdb["spec"]["minAvailable"] == "50%" and "maxUnavailable" not in pdb["spec"]


def test_autoscaler_scales_the_inference_service():
    hpa = horizontal_pod_autoscaler(
        isvc(
            {
                "autoscaling": {
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "metric": "requestsWaiting",
                    "target": 5,
                }
            }
        )
    )
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "octavo.dev/v1alpha1",
        "kind": "InferenceService",
        "name": "chat",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"] == {"name": "vllm_num_requests_waiting"}
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "5"}
    kv = horizontal_pod_autoscaler(
        isvc({"autoscaling": {"maxReplicas": 2, "metric": "kvCacheUsage", "target": 0.75}})
    )
    assert kv["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_kv_cache_usage_perc"
    assert kv["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "750m"


def test_quantities():
    assert [quantity(v) for v in (5, 5.0, 0.5, 0.125, 1.5)] == ["5", "5", "500m", "125m", "1500m"]


def test_cache_claim():
    pvc = cache_claim(isvc({"cache": {"size": "40Gi", "storageClassName": "fast"}}))
    assert pvc["metadata"]["name"] == "chat-cache"
    assert pvc["metadata"]["ownerReferences"][0]["name"] == "chat"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "40Gi"}},
        "storageClassName": "fast",
    }


def kinds(objs: list[dict]) -> list[str]:
    return [o["kind"] for o in objs]


def test_minimal_spec_gets_deployment_and_service_and_turns_the_rest_off():
    out = desired_children(isvc(), "img:1", service_monitors_served=False)
    assert kinds(out.apply) == ["Deployment", "Service"]
    assert out.remove == [
        ChildRef("v1", "ConfigMap", "chat-adapters"),
        ChildRef("policy/v1", "PodDisruptionBudget", "chat"),
        ChildRef("autoscaling/v2", "HorizontalPodAutoscaler", "chat"),
        ChildRef("networking.k8s.io/v1", "NetworkPolicy", "chat"),
        # spec.router off: the endpoint picker's objects (the pool only where its API is)
        ChildRef("v1", "ServiceAccount", "chat-epp"),
        ChildRef("rbac.authorization.k8s.io/v1", "Role", "chat-epp"),
        ChildRef("rbac.authorization.k8s.io/v1", "RoleBinding", "chat-epp"),
        ChildRef("v1", "ConfigMap", "chat-epp"),
        ChildRef("apps/v1", "Deployment", "chat-epp"),
        ChildRef("v1", "Service", "chat-epp"),
    ]
    assert out.apply[0]["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"


def test_everything_asked_for():
    spec = {
        "image": "mine:2",
        "cache": {"size": "10Gi"},
        "disruptionBudget": {"maxUnavailable": 1},
        "autoscaling": {"maxReplicas": 3},
        "monitoring": {"serviceMonitor": True},
        "networkPolicy": {"enabled": True},
        "adapters": [{"name": "sql", "uri": "hf://org/sql"}],
        "router": {"enabled": True},
    }
    out = desired_children(
        isvc(spec), "img:1", service_monitors_served=True, inference_pools_served=True
    )
    assert kinds(out.apply) == [
        "ConfigMap",
        "Deployment",
        "Service",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "ServiceMonitor",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "InferencePool",
    ]
    assert out.remove == []
    assert out.apply[1]["spec"]["template"]["spec"]["containers"][0]["image"] == "mine:2"


def test_service_monitor_needs_its_crd():
    spec = {"monitoring": {"serviceMonitor": True}}
    out = desired_children(isvc(spec), "img:1", service_monitors_served=False)
    assert "ServiceMonitor" not in kinds(out.apply)
    assert all(r.kind != "ServiceMonitor" for r in out.remove)  # nothing to delete either
    off = desired_children(isvc(), "img:1", service_monitors_served=True)
    assert ChildRef("monitoring.coreos.com/v1", "ServiceMonitor", "chat") in off.remove
