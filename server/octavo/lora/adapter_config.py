"""A PEFT adapter's ``adapter_config.json``, read and checked field by field.

Every problem is a ``ValueError`` naming it (the server answers it as a 400): a config
that is not a JSON object, a rank that is not a whole number in ``[1, max_lora_rank]``,
a non-finite ``lora_alpha``, ``target_modules`` of the wrong type, options we do not
implement. A folder without the config is "not an adapter", in the one text the server
also uses for paths it may not read (``not_an_adapter``), so a caller cannot tell the two
apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20  # PEFT's configs are about 1 kB
MAX_SCALING = 1e4  # lora_alpha / r (or / sqrt(r)); PEFT adapters use 0.5 to ~64
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
UNSUPPORTED_OPTIONS = (
    "use_dora",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
)


@dataclass(frozen=True)
class AdapterSettings:
    rank: int
    scaling: float  # lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
    targets: tuple[str, ...]


def not_an_adapter(path: str) -> ValueError:
    """The one answer for a path that is missing, not an adapter, or not allowed."""
    return ValueError(
        f"LoRA adapter {path!r} is not an adapter this server can load: an adapter is a "
        f"folder holding {CONFIG_FILE} and {WEIGHTS_FILE}, and run-time loads read only "
        "under --lora-allowed-roots and the folders of --lora-modules"
    )


def read_settings(
    folder: Path, path: str, max_rank: int, fused: tuple[str, ...] = ()
) -> AdapterSettings:
    """The checked settings of the adapter in ``folder`` (``path``: as the caller named it;
    ``fused``: the model's fused module names an adapter may also target)."""
    settings = _json_object(folder / CONFIG_FILE, path)
    peft_type = settings.get("peft_type", "LORA")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise ValueError(f"LoRA adapter {path}: peft_type {peft_type!r} is not LORA")
    used = [key for key in UNSUPPORTED_OPTIONS if settings.get(key)]
    if settings.get("bias", "none") not in ("none", None):
        used.append("bias")
    if used:
        raise ValueError(f"LoRA adapter {path}: unsupported options {used}")
    rank = _rank(settings, path, max_rank)
    scaling = _scaling(settings, path, rank)
    return AdapterSettings(rank, scaling, _targets(settings, path, (*MODULES, *fused)))


def _json_object(config_file: Path, path: str) -> dict[str, Any]:
    if not config_file.is_file():
        raise not_an_adapter(path)
    try:
        size = config_file.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(
                f"LoRA adapter {path}: {CONFIG_FILE} is {size} bytes, more than "
                f"the {MAX_CONFIG_BYTES} an adapter config may be"
            )
        text = config_file.read_bytes().decode("utf-8")
    except OSError:
        raise ValueError(f"LoRA adapter {path}: {CONFIG_FILE} cannot be read") from None
    except UnicodeDecodeError:
        raise ValueError(f"LoRA adapter {path}: {CONFIG_FILE} is not UTF-8 text") from None
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"LoRA adapter {path}: {CONFIG_FILE} is not JSON ({error.msg} at line {error.lineno})"
        ) from None
    except (ValueError, RecursionError):  # too deep, or an integer of 4300+ digits
        raise ValueError(f"LoRA adapter {path}: {CONFIG_FILE} is not JSON we read") from None
    if not isinstance(settings, dict):
        raise ValueError(
            f"LoRA adapter {path}: {CONFIG_FILE} must hold a JSON object, "
            f"not a {_json_type(settings)}"
        )
    return settings


def _rank(settings: dict[str, Any], path: str, max_rank: int) -> int:
    rank = settings.get("r")
    if rank is None:
        raise ValueError(f"LoRA adapter {path}: {CONFIG_FILE} has no r (the rank)")
    if isinstance(rank, float) and math.isfinite(rank) and rank.is_integer():
        rank = int(rank)
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ValueError(f"LoRA adapter {path}: r must be a whole number, got {_shown(rank)}")
    if not 1 <= rank <= max_rank:
        raise ValueError(
            f"LoRA adapter {path}: rank {_shown(rank)} is outside [1, max_lora_rank={max_rank}]"
        )
    return rank


def _scaling(settings: dict[str, Any], path: str, rank: int) -> float:
    alpha = settings.get("lora_alpha", rank)
    if alpha is None:
        alpha = rank
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"LoRA adapter {path}: lora_alpha must be a number, got {_shown(alpha)}")
    rslora = settings.get("use_rslora", False)
    if rslora is not None and not isinstance(rslora, bool):
        raise ValueError(
            f"LoRA adapter {path}: use_rslora must be true or false, got {_shown(rslora)}"
        )
    try:
        scaling = alpha / rank**0.5 if rslora else alpha / rank
    except OverflowError:  # an integer too large for a float
        scaling = math.inf
    if not math.isfinite(scaling) or abs(scaling) > MAX_SCALING:
        raise ValueError(
            f"LoRA adapter {path}: lora_alpha {_shown(alpha)} with r={rank} "
            f"scales the delta by more than {MAX_SCALING:g}"
        )
    return float(scaling)


def _targets(settings: dict[str, Any], path: str, modules: tuple[str, ...]) -> tuple[str, ...]:
    targets = settings.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ValueError(
            f"LoRA adapter {path}: target_modules must be a module name or a "
            f"list of names, got {_shown(targets)}"
        )
    unknown = sorted(set(targets) - set(modules))
    if unknown:
        raise ValueError(
            f"LoRA adapter {path}: target modules {_shown(unknown)} are not in "
            f"the model's adaptable layers {list(modules)}"
        )
    return tuple(targets)


def _json_type(value: Any) -> str:
    names = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _shown(value: Any, limit: int = 80) -> str:
    """A value from the config, cut short so an error message stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
