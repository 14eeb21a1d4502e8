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
