"""`spec.router`: routing across replicas through a Gateway API Inference Extension
InferencePool and the llm-d router's endpoint picker (EPP), as children the operator owns."""

from __future__ import annotations

from octavo_operator import constants as c

from .engine_schema import sets_flag_rule
from .schema import Schema, free_form, integer, obj, rule, string


def weight(description: str, default: float) -> Schema:
    return {
        "type": "number",
        "description": f"{description} (0 turns the scorer off)",
        "minimum": 0,
        "maximum": 100,
        "default": default,
    }


def scorers_schema() -> Schema:
    return obj(
        "Weights of the picker's scorers; each pod's score is the weighted sum. The defaults "
        "are the llm-d router's own.",
        {
            "precisePrefixCache": weight(
                "prefer the pod whose KV cache holds the longest prefix of the prompt, from "
                "the pods' KV events",
                3,
            ),
            "queue": weight("prefer the pod with the fewest waiting requests", 2),
            "kvCacheUtilization": weight("prefer the pod with the most free KV cache", 2),
            "loraAffinity": weight("prefer a pod that has the request's LoRA adapter loaded", 1),
        },
        default={},
        **{
            "x-kubernetes-validations": [
                rule(
                    "self.precisePrefixCache + self.queue + self.kvCacheUtilization "
                    "+ self.loraAffinity > 0",
                    "at least one scorer needs a weight above 0",
                )
            ]
        },
    )


def _requirements(resources: dict[str, dict[str, str]]) -> str:
    """``requests cpu 250m, memory 512Mi; limits ...`` for a description."""
    return "; ".join(
        f"{kind} " + ", ".join(f"{name} {amount}" for name, amount in amounts.items())
        for kind, amounts in resources.items()
    )


def picker_schema() -> Schema:
    return obj(
        "The endpoint picker: the llm-d router's EPP, with a tokenizer sidecar running "
        "`octavo launch render` on the service's image and model.",
        {
            "image": string(
                f"the EPP image (default: the operator's, {c.DEFAULT_PICKER_IMAGE})",
                pattern=r"^[^\s]+$",
                maxLength=512,
            ),
            "replicas": integer(
                1,
                5,
                description="EPP replicas; more than 1 elects a leader, the others stand by",
                default=1,
            ),
            "resources": free_form("EPP container resources (core/v1 ResourceRequirements)"),
            "tokenizerResources": free_form(
                "tokenizer sidecar resources (core/v1 ResourceRequirements; default: "
                f"{_requirements(c.TOKENIZER_RESOURCES)})"
            ),
            "failureMode": string(
                "what the gateway does when the picker does not answer: FailOpen sends the "
                "request to any pod of the pool, FailClose refuses it",
                enum=["FailOpen", "FailClose"],
                default="FailOpen",
            ),
            "secureServing": {
                "type": "boolean",
                "description": "serve the gateway's ext_proc calls over TLS (a self-signed "
                "certificate); agentgateway needs false",
                "default": True,
            },
        },
        default={},
    )


def router_schema() -> Schema:
    return obj(
        "Routing across replicas: an InferencePool (inference.networking.k8s.io/v1) of the "
        "service's pods and the llm-d router's endpoint picker, which a Gateway (Istio, "
        "kgateway, agentgateway) asks per request which pod to use. The servers publish KV "
        "events for the picker's prefix-cache scorer. Needs the InferencePool CRD.",
        {
            "enabled": {
                "type": "boolean",
                "description": "create the pool and the picker (deleted when turned off)",
                "default": False,
            },
            "picker": picker_schema(),
            "scorers": scorers_schema(),
            "blockSize": integer(
                1,
                1024,
                description="tokens per block the picker hashes prompts in (default: "
                "engine.blockSize)",
            ),
            "kvEventsPort": integer(
                1024,
                65534,
                description="the servers' ZMQ port for KV events (the next port serves replays)",
                default=c.KV_EVENTS_PORT,
            ),
        },
        default={},
        **{
            "x-kubernetes-validations": [
                rule(
                    f"self.kvEventsPort != {c.SERVER_PORT} && "
                    f"self.kvEventsPort + 1 != {c.SERVER_PORT}",
                    f"kvEventsPort and the replay port after it must not be the server's "
                    f"port {c.SERVER_PORT}",
                )
            ]
        },
    )


def router_rules() -> list[dict[str, str]]:
    """Spec-level rule: KV events are the operator's to configure (the pool already keeps
    --port, which extraArgs may never set, at 8000)."""
    flag = "--kv-events-config"
    clash = sets_flag_rule(repr(flag))
    return [
        rule(
            "!has(self.router) || !self.router.enabled || !has(self.engine.extraArgs) || "
            f"self.engine.extraArgs.all(a, !({clash}))",
            f"with router.enabled the operator sets {flag} (KV events for the picker): "
            "engine.extraArgs must not set it",
        ),
    ]
