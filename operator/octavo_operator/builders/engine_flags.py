"""`spec.engine` as `octavo serve` flags, one per ENGINE_FIELDS entry that has a value."""

from __future__ import annotations

import json
from typing import Any

from octavo_operator.api.engine_fields import ENGINE_FIELDS, EngineField
from octavo_operator.api.service import InferenceService

CPU_DEVICE = ["--device", "cpu"]
# Flags go out in groups: values, then the device's (GPU-only values, or CPU_DEVICE), then
# on/off switches. That is the order Deployments have always had, so an operator upgrade
# changes no pod template and restarts no server.
VALUES, DEVICE, SWITCHES = range(3)


def engine_flags(isvc: InferenceService) -> list[str]:
    has_gpu = isvc.resources.gpu > 0
    groups: list[tuple[int, list[str]]] = [
        (flag_group(f), field_flags(f, isvc.engine.settings[f.name]))
        for f in ENGINE_FIELDS
        if has_gpu or not f.needs_gpu
    ]
    if not has_gpu:
        groups.append((DEVICE, CPU_DEVICE))
    ordered = sorted(groups, key=lambda group: group[0])  # stable: declaration order within
    return [flag for _, flags in ordered for flag in flags]


def flag_group(field: EngineField) -> int:
    if field.is_switch:
        return SWITCHES
    return DEVICE if field.needs_gpu else VALUES


def field_flags(field: EngineField, value: Any) -> list[str]:
    """`--flag VALUE`; a switch as `--flag` or `--no-flag`; nothing for None (unset)."""
    if value is None:
        return []
    if field.is_switch:
        return [field.flag if value else "--no-" + field.flag.removeprefix("--")]
    if isinstance(value, dict):  # an object field: the JSON the flag takes
        return [field.flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
    return [field.flag, str(value)]
