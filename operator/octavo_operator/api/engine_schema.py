"""The schema of `spec.engine`: the properties of ENGINE_FIELDS, extraArgs, and CEL rules."""

from __future__ import annotations

import copy
from typing import Any

from .engine_fields import ENGINE_FIELDS, EngineField, engine_field
from .schema import Schema, integer, obj, rule

# Flags the operator sets (or that would put a key in the Deployment): refused in extraArgs,
# spelled out, with a value (--port=1) or abbreviated (--po), which argparse would accept.
OPERATOR_FLAGS = ("--host", "--port", "--served-model-name", "--api-key")
# The multi-node flags, set from engine.nodes on the LeaderWorkerSet's pods: refused too.
MULTI_NODE_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")
NODES: Schema = integer(
    1,
    64,
    description="hosts one replica spans: above 1 the replica is a LeaderWorkerSet group "
    "(needs the LeaderWorkerSet API, kubernetes-sigs/lws) of this many pods, the leader "
    "serving the API and `--headless` workers; each pod gets resources.gpu GPUs and runs "
    "tensorParallelSize × pipelineParallelSize / nodes ranks",
    default=1,
)
EXTRA_ARGS: Schema = {
    "type": "array",
    "description": "more `octavo serve` flags, appended as given",
    "items": {"type": "string", "maxLength": 256},
    "maxItems": 64,
}


def engine_schema() -> Schema:
    properties = {f.name: copy.deepcopy(f.schema) for f in ENGINE_FIELDS}
    properties["nodes"] = copy.deepcopy(NODES)
    properties["extraArgs"] = copy.deepcopy(EXTRA_ARGS)
    return obj(
        "Engine settings, passed to `octavo serve` as the flags of the same (vLLM) names.",
        properties,
        default={},
        **{"x-kubernetes-validations": engine_rules()},
    )


def engine_rules() -> list[dict[str, Any]]:
    flags = ", ".join(OPERATOR_FLAGS)
    memory = engine_field("gpuMemoryUtilization").name  # a KeyError if it were renamed
    return [
        one_of_rule(engine_field("blockSize")),
        rule(
            "!has(self.attentionBackend) || self.attentionBackend != 'FLASH_ATTN' || "
            "self.blockSize % 256 == 0",
            "engine.attentionBackend FLASH_ATTN needs engine.blockSize 256 (torch's "
            "FlashAttention-2 reads the KV cache in pages of 256 tokens)",
        ),
        rule(
            f"self.{memory} > 0.0 && self.{memory} <= 1.0",
            f"engine.{memory} must be in (0, 1]",
        ),
        rule(
            extra_args_rule(OPERATOR_FLAGS),
            f"engine.extraArgs must not set {flags}, nor an abbreviation of one (--po): the "
            "operator sets them, and an API key here would be readable in the Deployment "
            "(use spec.apiKeySecretRef)",
        ),
        rule(
            extra_args_rule(MULTI_NODE_FLAGS),
            f"engine.extraArgs must not set {', '.join(MULTI_NODE_FLAGS)}, nor an abbreviation "
            "of one: the operator sets them from engine.nodes",
        ),
        rule(
            "self.nodes <= 1 || "
            "(self.tensorParallelSize * self.pipelineParallelSize) % self.nodes == 0",
            "engine.nodes must divide engine.tensorParallelSize × engine.pipelineParallelSize "
            "(every node runs the same number of ranks)",
        ),
    ]


def one_of_rule(field: EngineField) -> dict[str, Any]:
    """The field is one of its allowed values ("must be 8, 16, 32, 64 or 128")."""
    values = [str(v) for v in field.allowed]
    spoken = ", ".join(values[:-1]) + " or " + values[-1]
    return rule(
        f"self.{field.name} in [{', '.join(values)}]",
        f"engine.{field.name} must be {spoken}",
    )


# CEL: the flag name of an argument `a` as `octavo serve` reads it: before any '=', with
# underscores as dashes (vLLM's --api_key spelling, which the server accepts).
ARG_NAME = "a.split('=')[0].replace('_', '-')"


def sets_flag_rule(flag: str) -> str:
    """CEL: argument `a` sets ``flag`` (a CEL string: a quoted flag or a variable):
    spelled out, with a value (--port=1), dotted or longer (--portx), in underscores
    (--api_key) or abbreviated (--po, --api-k=KEY): argparse expands unique prefixes."""
    return (
        f"{ARG_NAME}.startsWith({flag}) || "
        f"({ARG_NAME}.startsWith('--') && {flag}.startsWith({ARG_NAME}))"
    )


def extra_args_rule(flags: tuple[str, ...]) -> str:
    """No argument sets a guarded flag (``sets_flag_rule``)."""
    guarded = "[" + ", ".join(f"'{f}'" for f in flags) + "]"
    clash = sets_flag_rule("f")
    return f"!has(self.extraArgs) || self.extraArgs.all(a, !{guarded}.exists(f, {clash}))"
