"""Names shared by the CRD, the builders and the handlers."""

from __future__ import annotations

GROUP = "octavo.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("isvc", "octavo")
CRD_NAME = f"{PLURAL}.{GROUP}"

FIELD_MANAGER = "octavo-operator"
SERVER_PORT = 8000
SERVER_PORT_NAME = "http"
CONTAINER_NAME = "server"
DEFAULT_SERVER_IMAGE = "ghcr.io/octavo-dev/octavo-server:0.1.0"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
EMBEDDED_MODEL = "embedded:SmolLM2-135M-Instruct"

# Labels on every child; `INSTANCE_LABEL` names the owning InferenceService.
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
APP_NAME = "octavo-server"
MANAGED_BY = "octavo-operator"

# spec.router: the llm-d router's endpoint picker (EPP), pinned; its ports are upstream's.
DEFAULT_PICKER_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
PICKER_SUFFIX = "-epp"  # the picker's Deployment, Service, ConfigMap, ServiceAccount, Role
PICKER_COMPONENT = "router"  # COMPONENT_LABEL of the picker's objects and pods
PICKER_GRPC_PORT = 9002  # ext_proc, what the gateway calls
PICKER_HEALTH_PORT = 9003  # gRPC health (liveness / readiness services)
PICKER_METRICS_PORT = 9090
RENDER_PORT = 8000  # the tokenizer sidecar in the picker pod (`octavo launch render`)
# The sidecar's resources when spec.router.picker.tokenizerResources names none: it takes
# end users' request bodies, so a flood is bounded by its limits, not by the node's memory.
# Measured: 857 MiB resident once ready (SmolLM2's tokenizer); a 256-prompt render +12 MiB.
TOKENIZER_RESOURCES = {
    "requests": {"cpu": "250m", "memory": "1Gi"},
    "limits": {"cpu": "2", "memory": "3Gi"},
}
KV_EVENTS_PORT = 5557  # the servers' ZMQ PUB socket; the replay socket is the next port
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
INFERENCE_POOL_CRD = "inferencepools.inference.networking.k8s.io"

# spec.engine.nodes > 1: one replica is a LeaderWorkerSet group (kubernetes-sigs/lws v0.9.0).
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
LWS_CRD = f"{LWS_PLURAL}.leaderworkerset.x-k8s.io"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # on every pod of the LWS's groups
LWS_SUFFIX = "-lws"  # not the Service's name: the LWS controller makes a headless Service so named
NODE_KEY_SUFFIX = "-node-key"  # the Secret holding OCTAVO_NODE_KEY
NODE_KEY_ENV = "OCTAVO_NODE_KEY"
NODE_KEY_FIELD = "node-key"
MASTER_PORT = 29501  # the leader's control listener; torch's rendezvous is the next port
WORKER_COMPONENT = "worker"  # COMPONENT_LABEL of the headless worker pods
# The StatefulSet controller labels each pod with `<statefulset>-<10-char hash>` (at most 63
# characters); the worker StatefulSets are `<name>-lws-<group>`, groups up to 999.
MAX_MULTI_NODE_NAME_LENGTH = 63 - 11 - len(LWS_SUFFIX) - 4

# spec.prefill: prefill/decode disaggregation on the llm-d path (KServe's LLMInferenceService
# shape). Both pools sit in one InferencePool on SERVER_PORT; `llm-d.ai/role` tells the
# picker's prefill-filter and decode-filter apart. A decode pod runs the llm-d router's
# routing sidecar on SERVER_PORT and its engine on DECODE_ENGINE_PORT (the sidecar's
# --model-server-port default); a prefill pod serves directly on SERVER_PORT.
ROLE_LABEL = "llm-d.ai/role"
PREFILL_ROLE, DECODE_ROLE = "prefill", "decode"
PREFILL_SUFFIX = "-prefill"  # the prefill pool's Deployment
PREFILL_COMPONENT = "prefill"  # COMPONENT_LABEL of the prefill Deployment and its pods
SIDECAR_SUFFIX = "-pd-sidecar"  # the routing sidecar's ServiceAccount, Role and RoleBinding
DEFAULT_SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.10.0"
SIDECAR_CONTAINER_NAME = "routing-sidecar"
DECODE_ENGINE_PORT = 8200
ENGINE_PORT_NAME = "engine"
# vLLM's NixlConnector side channel (VLLM_NIXL_SIDE_CHANNEL_PORT's default): where a decode
# engine asks a prefill engine for its KV metadata and blocks.
NIXL_SIDE_CHANNEL_PORT = 5600
NIXL_PORT_NAME = "nixl"
