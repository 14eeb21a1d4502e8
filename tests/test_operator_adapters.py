"""spec.adapters in the operator: the ConfigMap a starting pod reads, the pod template
(which a changed list leaves alone), claim mounts, the per-pod load/unload sync against
a fake pod API, and the AdaptersReady condition."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from octavo_operator.adapter_sync import adapters_condition, sync_adapters
from octavo_operator.builders.adapters import LORA_MODULES_ENV
from octavo_operator.builders.children import desired_children
from octavo_operator.builders.deployment import deployment
from octavo_operator.pod_adapters import PodUnreachable
from octavo_operator.status import Observed, compute

from isvc_factories import isvc

TWO = [{"name": "sql", "uri": "pvc://loras/sql"}, {"name": "chat", "uri": "hf://org/chat"}]


def children_of(spec: dict) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in desired_children(isvc(spec), "img:1", False).apply}


def test_adapters_become_a_config_map_read_at_start_and_lora_is_turned_on():
    kids = children_of({"adapters": TWO})
    assert next(iter(kids)) == "ConfigMap", "applied before the Deployment its pods read it"
    assert kids["ConfigMap"]["data"]["lora-modules"] == "sql=/adapters/loras/sql chat=hf://org/chat"
    container = kids["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-lora" in container["args"]
    at = container["args"].index("--allow-runtime-lora-updating")  # the sync's load routes
    assert container["args"][at + 1 : at + 3] == ["--lora-allowed-roots", "/adapters"]
    (env,) = [e for e in container["env"] if e["name"] == LORA_MODULES_ENV]
    assert env["valueFrom"]["configMapKeyRef"]["name"] == "chat-adapters"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/adapters/loras"]["readOnly"]


def test_a_changed_adapter_list_leaves_the_pod_template_alone():
    before = deployment(isvc({"adapters": TWO}), "img:1")["spec"]["template"]
    changed = [*TWO[1:], {"name": "new", "uri": "file:///opt/new"}, TWO[0]]
    after = deployment(isvc({"adapters": changed}), "img:1")["spec"]["template"]
    assert before == after


def test_without_adapters_no_lora_and_the_config_map_is_removed():
    out = desired_children(isvc({}), "img:1", False)
    assert "ConfigMap" not in {obj["kind"] for obj in out.apply}
    assert ("ConfigMap", "chat-adapters") in {(r.kind, r.name) for r in out.remove}
    args = out.apply[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--enable-lora" not in args
    empty = children_of({"adapters": []})
    assert (
        "--enable-lora" in empty["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    )


@dataclass
class FakePod:
    served: dict[str, str] = field(default_factory=dict)
    refuse: dict[str, str] = field(default_factory=dict)  # path -> why
    calls: list[str] = field(default_factory=list)
    down: bool = False
    listing_error: str | None = None  # an HTTP error status on GET /v1/models

    def api(self, url: str) -> FakePod:
        self.calls.append(url)
        return self

    def load(self, name: str, path: str) -> None:
        if self.down:
            raise PodUnreachable("connection refused")
        if path in self.refuse:
            raise ValueError(self.refuse[path])
        self.served[name] = path

    def unload(self, name: str) -> None:
        del self.served[name]

    def list(self) -> dict[str, str]:
        if self.down:
            raise PodUnreachable("connection refused")
        if self.listing_error is not None:
            raise ValueError(self.listing_error)
        return dict(self.served)


def pod(name: str, ip: str, ready: bool = True) -> dict:
    status = {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}
    return {"metadata": {"name": name}, "status": status}


class Api:
    """PodAdapterAPI's shape over a FakePod (served() is the listing)."""

    def __init__(self, fake: FakePod) -> None:
        self.fake = fake

    def served(self) -> dict[str, str]:
        return self.fake.list()

    def load(self, name: str, path: str) -> None:
        self.fake.load(name, path)

    def unload(self, name: str) -> None:
        self.fake.unload(name)


def test_sync_loads_the_missing_unloads_the_removed_and_reloads_a_moved_adapter():
    first = FakePod(served={"old": "/x", "chat": "hf://org/other"})
    second = FakePod()
    fakes = {"10.0.0.1": first, "10.0.0.2": second}
    pods = [pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2"), pod("p3", "10.0.0.3", ready=False)]
    report = sync_adapters(
        isvc({"adapters": TWO}), pods, lambda url: Api(fakes[url.split("//")[1].split(":")[0]])
    )
    wanted = {"sql": "/adapters/loras/sql", "chat": "hf://org/chat"}
    assert first.served == wanted and second.served == wanted
    assert report.ready_pods == ["p1", "p2"] and report.loaded == {"sql": 2, "chat": 2}
    condition = adapters_condition(report)
    assert condition.status and condition.reason == "Loaded"


def test_a_refused_adapter_is_named_in_the_condition_and_the_rest_are_served():
    fake = FakePod(refuse={"hf://org/chat": "HTTP 400: rank 64 is outside [1, 16]"})
    report = sync_adapters(isvc({"adapters": TWO}), [pod("p1", "10.0.0.1")], lambda _: Api(fake))
    assert fake.served == {"sql": "/adapters/loras/sql"}
    condition = adapters_condition(report)
    assert not condition.status and condition.reason == "LoadFailed"
    assert "chat: 0/1 pods, p1: HTTP 400: rank 64" in condition.message
    assert "sql: 1/1 pods" in condition.message


@pytest.mark.parametrize(
    ("pods", "reason"), [([], "NoReadyPods"), ([pod("p1", "10.0.0.1")], "Loading")]
)
def test_no_ready_pod_or_an_unreachable_one_is_not_ready(pods, reason):
    fake = FakePod(down=True)
    report = sync_adapters(isvc({"adapters": TWO}), pods, lambda _: Api(fake))
    condition = adapters_condition(report)
    assert not condition.status and condition.reason == reason


def test_a_pod_whose_listing_fails_is_reported_and_the_others_are_still_synced():
    """An HTTP error on one pod's GET /v1/models (something else answers at its address)
    is that pod's problem in the condition, never an exception out of the timer."""
    broken, healthy = FakePod(listing_error="HTTP 404: Not Found"), FakePod()
    fakes = {"10.0.0.1": broken, "10.0.0.2": healthy}
    pods = [pod("p1", "10.0.0.1"), pod("p2", "10.0.0.2")]

    def api_for(url: str) -> Api:
        return Api(fakes[url.split("//")[1].split(":")[0]])

    report = sync_adapters(isvc({"adapters": TWO}), pods, api_for)
    assert healthy.served == {"sql": "/adapters/loras/sql", "chat": "hf://org/chat"}
    assert report.unreachable == {"p1": "listing its adapters failed: HTTP 404: Not Found"}
    condition = adapters_condition(report)
    assert not condition.status and condition.reason == "Loading"
    assert "pod p1 unreachable: listing its adapters failed: HTTP 404" in condition.message


def test_the_condition_appears_only_with_spec_adapters():
    _, without = compute(isvc({}), Observed())
    assert "AdaptersReady" not in {c.type for c in without}
    _, pending = compute(isvc({"adapters": TWO}), Observed())
    (adapters,) = [c for c in pending if c.type == "AdaptersReady"]
    assert adapters.reason == "Pending" and not adapters.status


def test_adapter_claims_count_with_the_model_and_cache_claims():
    service = isvc(
        {"model": {"uri": "pvc://models/llama"}, "cache": {"claimName": "cache"}, "adapters": TWO}
    )
    assert service.claims == [
        ("model.uri", "models"),
        ("cache.claimName", "cache"),
        ("adapters[sql].uri", "loras"),
    ]
    _, conditions = compute(service, Observed(missing_claims=service.claims[2:]))
    (degraded,) = [c for c in conditions if c.type == "Degraded"]
    assert degraded.reason == "ClaimNotFound" and "adapters[sql].uri" in degraded.message
