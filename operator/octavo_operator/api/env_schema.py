"""`spec.env`: the core/v1 EnvVar shape, typed, so that admission (the CRD's rules and the
chart's ValidatingAdmissionPolicy) can see which Secrets and ConfigMaps an entry reads."""

from __future__ import annotations

from .schema import DNS_SUBDOMAIN, INT_OR_STRING, QUANTITY, Schema, obj, rule, string

ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
VALUE_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")


def key_ref(kind: str) -> Schema:
    """secretKeyRef / configMapKeyRef: a key of a named object in the pod's namespace."""
    return obj(
        f"a key of a {kind} in the namespace",
        {
            "name": string(f"{kind} name", pattern=DNS_SUBDOMAIN, maxLength=253),
            "key": string(f"key in the {kind}", pattern=CONFIG_KEY, maxLength=253),
            "optional": {"type": "boolean", "description": f"start even if the {kind} is missing"},
        },
        required=["name", "key"],
    )


def field_ref() -> Schema:
    return obj(
        "a field of the pod, e.g. metadata.name or status.podIP",
        {
            "fieldPath": string("path of the field", maxLength=256),
            "apiVersion": string("version of the schema of fieldPath (default v1)"),
        },
        required=["fieldPath"],
    )


def resource_field_ref() -> Schema:
    return obj(
        "a resource request or limit of the container, e.g. limits.memory",
        {
            "resource": string("the resource", maxLength=256),
            "containerName": string("the container (default: the server)"),
            # A pattern only: a CEL rule here, once per entry of the list, would take the
            # CRD over the apiserver's validation cost budget.
            "divisor": {
                **INT_OR_STRING,
                "pattern": QUANTITY,
                "description": "unit of the exposed value, e.g. 1Mi",
            },
        },
        required=["resource"],
    )


def value_from() -> Schema:
    found = ", ".join(f"has(self.{source})" for source in VALUE_SOURCES)
    return obj(
        "where the value comes from: exactly one source",
        {
            "secretKeyRef": key_ref("Secret"),
            "configMapKeyRef": key_ref("ConfigMap"),
            "fieldRef": field_ref(),
            "resourceFieldRef": resource_field_ref(),
        },
        **{
            "x-kubernetes-validations": [
                rule(
                    f"[{found}].filter(x, x).size() == 1",
                    "env valueFrom needs exactly one of " + ", ".join(VALUE_SOURCES),
                )
            ]
        },
    )


def env_var() -> Schema:
    return obj(
        "an environment variable (core/v1 EnvVar)",
        {
            "name": string("variable name", pattern=ENV_NAME, maxLength=256),
            "value": string("the value, in plain text in the Deployment"),
            "valueFrom": value_from(),
        },
        required=["name"],
        **{"x-kubernetes-validations": env_var_rules()},
    )


def env_var_rules() -> list[dict[str, str]]:
    return [
        rule(
            "!(has(self.value) && has(self.valueFrom))",
            "an env entry takes value or valueFrom, not both",
        ),
        rule(
            "self.name != 'OCTAVO_API_KEY' || !has(self.value)",
            "OCTAVO_API_KEY must not be a plain value (it would be readable in the "
            "Deployment): use spec.apiKeySecretRef",
        ),
    ]


def env_schema() -> Schema:
    return {
        "type": "array",
        "description": "extra container environment (core/v1 EnvVar)",
        "items": env_var(),
        "maxItems": 64,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    }
