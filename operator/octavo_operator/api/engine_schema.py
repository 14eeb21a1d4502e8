"""The schema of `spec.engine`: the properties of ENGINE_FIELDS, extraArgs, and CEL rules."""

from __future__ import annotations

import copy
from typing import Any

from .engine_fields import ENGINE_FIELDS, EngineField, engine_field
from .schema import Schema, obj, rule

# Flags the operator sets (or that would put a key in the Deployment): refused in extraArgs,
# spelled out, with a value (--port=1) or abbreviated (--po), which argparse would accept.
OPERATOR_FLAGS = ("--host", "--port", "--served-model-name", "--api-key")
EXTRA_ARGS: Schema = {
    "type": "array",
    "description": "more `octavo serve` flags, appended as given",
    "items": {"type": "string", "maxLength": 256},
    "maxItems": 64,
}


def engine_schema() -> Schema:
    properties = {f.name: copy.deepcopy(f.schema) for f in ENGINE_FIELDS}
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
            f"self.{memory} > 0.0 && self.{memory} <= 1.0",
            f"engine.{memory} must be in (0, 1]",
        ),
        rule(
            extra_args_rule(),
            f"engine.extraArgs must not set {flags}, nor an abbreviation of one (--po): the "
            "operator sets them, and an API key here would be readable in the Deployment "
            "(use spec.apiKeySecretRef)",
        ),
    ]


def one_of_rule(field: EngineField) -> dict[str, Any]:
    """The field is one of its allowed values ("must be 8, 16 or 32")."""
    values = [str(v) for v in field.allowed]
    spoken = ", ".join(values[:-1]) + " or " + values[-1]
    return rule(
        f"self.{field.name} in [{', '.join(values)}]",
        f"engine.{field.name} must be {spoken}",
    )


def extra_args_rule() -> str:
    """No argument is a guarded flag, starts with one (--port=1, --portx) or is a prefix of
    one (--po, --api-k=KEY): argparse expands unique prefixes unless allow_abbrev=False."""
    guarded = "[" + ", ".join(f"'{f}'" for f in OPERATOR_FLAGS) + "]"
    clash = "a.startsWith(f) || (a.startsWith('--') && f.startsWith(a.split('=')[0]))"
    return f"!has(self.extraArgs) || self.extraArgs.all(a, !{guarded}.exists(f, {clash}))"
