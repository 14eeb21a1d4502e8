"""A model's pooling defaults, read as sentence-transformers reads them.

A sentence-transformers folder has ``modules.json`` (Transformer → Pooling → Dense →
Normalize, Dense optional: ``dense_modules`` applies it),
each module's ``type`` a class path: ``sentence_transformers.models.Pooling`` as versions
before 6 write it, ``sentence_transformers.sentence_transformer.modules.pooling.Pooling``
(or ``...base.modules.normalize.Normalize``) as 6 writes it; the class name decides. The
Pooling module's ``config.json`` names its mode (``pooling_mode_lasttoken``,
``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``, or newer ``pooling_mode``).
A folder without it pools the last token and normalises (vLLM's default for decoders).
``--pooler-config`` overrides either. Matryoshka sizes come from ``config.json``
(``is_matryoshka``, ``matryoshka_dimensions``), as vLLM reads them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from octavo.pooling.params import PoolerConfig, PoolingType

logger = logging.getLogger(__name__)
MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
ST_PACKAGE = "sentence_transformers."
_MODES = {  # the Pooling module's flag -> our pooling type
    "pooling_mode_lasttoken": PoolingType.LAST,
    "pooling_mode_mean_tokens": PoolingType.MEAN,
    "pooling_mode_cls_token": PoolingType.CLS,
}
_MODE_NAMES = {"lasttoken": PoolingType.LAST, "mean": PoolingType.MEAN, "cls": PoolingType.CLS}
_SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")  # in this order


def read_pooler_config(
    folder: Path,
    hidden_size: int,
    overrides: dict[str, Any] | None = None,
    model: PoolerConfig | None = None,
) -> PoolerConfig:
    """The model's pooling defaults (``overrides``: ``--pooler-config``'s values; ``model``:
    the architecture's own, an encoder's CLS or a classifier's logits)."""
    pooling_type, normalize = PoolingType.LAST, True
    if model is not None:
        pooling_type, normalize = model.pooling_type, model.normalize
        hidden_size = model.hidden_size
    modules = sentence_transformer_modules(folder)
    if modules is not None:
        pooling_type, normalize = _from_modules(folder, modules)
        hidden_size = _dense_output_size(folder) or hidden_size
        _warn_about_chat_rendering(folder)
    overrides = overrides or {}
    if overrides.get("pooling_type") is not None:
        pooling_type = PoolingType.parse(overrides["pooling_type"])
    if overrides.get("normalize") is not None:
        normalize = bool(overrides["normalize"])
    raw = json.loads((folder / "config.json").read_text())
    dims = raw.get("matryoshka_dimensions")
    return PoolerConfig(
        pooling_type=pooling_type,
        normalize=normalize,
        hidden_size=hidden_size,
        matryoshka_dimensions=tuple(int(d) for d in dims) if dims else None,
        is_matryoshka=bool(raw.get("is_matryoshka")),
        classifies=model is not None and model.classifies,
        labels=_class_labels(raw) if model is not None and model.classifies else (),
    )


def _class_labels(raw: dict[str, Any]) -> tuple[str, ...]:
    """A classifier's class names in id order (config.json's ``id2label``; absent: none)."""
    id2label = raw.get("id2label") or {}
    return tuple(str(id2label[key]) for key in sorted(id2label, key=int))


def sentence_transformer_modules(folder: Path) -> list[dict] | None:
    """``modules.json``'s entries, or None when the folder is not a sentence-transformers
    model."""
    path = folder / MODULES_FILE
    if not path.is_file():
        return None
    modules = json.loads(path.read_text())
    if not isinstance(modules, list):
        raise ValueError(f"{path} must hold a list of modules")
    return modules


def has_pooling_module(folder: Path) -> bool:
    modules = sentence_transformer_modules(folder) or []
    return any(module_kind(module) == "Pooling" for module in modules)


def _from_modules(folder: Path, modules: list[dict]) -> tuple[PoolingType, bool]:
    pooling_type, normalize = PoolingType.LAST, False
    kinds = [module_kind(module) for module in modules]
    for kind in kinds:
        if kind not in _SUPPORTED_MODULES:
            raise ValueError(
                f"{folder / MODULES_FILE}: the sentence-transformers module {kind!r} is not "
                f"supported (Octavo runs {', '.join(_SUPPORTED_MODULES)})"
            )
    order = [_SUPPORTED_MODULES.index(kind) for kind in kinds]
    if order != sorted(order):
        raise ValueError(
            f"{folder / MODULES_FILE}: Octavo runs the modules in the order "
            f"{' → '.join(_SUPPORTED_MODULES)}, not {' → '.join(kinds)}"
        )
    for module, kind in zip(modules, kinds, strict=True):
        if kind == "Pooling":
            pooling_type = _pooling_mode(folder / module.get("path", "") / "config.json")
        normalize = normalize or kind == "Normalize"
    return pooling_type, normalize


def _warn_about_chat_rendering(folder: Path) -> None:
    """sentence-transformers 6 renders plain text through the chat template when the
    Transformer module's ``modality_config`` has ``message``; Octavo embeds text as given."""
    path = folder / ST_CONFIG_FILE
    settings = json.loads(path.read_text()) if path.is_file() else {}
    if "message" in (settings.get("modality_config") or {}):
        logger.warning(
            "%s: sentence-transformers 6 renders plain-text inputs of this model through its "
            "chat template; Octavo (as vLLM) embeds the text as given, so apply the template "
            "to the inputs yourself to get sentence-transformers' vectors",
            path,
        )


def _dense_output_size(folder: Path) -> int | None:
    """The pooled vector's size after the Dense modules (None: there are none)."""
    from octavo.pooling.dense_modules import dense_output_size  # (it imports this module)

    return dense_output_size(folder)


def module_kind(module: dict) -> str:
    """The module's class name where sentence-transformers defines it (any of its module
    paths), else the whole ``type`` (a custom module, refused by name)."""
    kind = str(module.get("type", ""))
    return kind.rpartition(".")[2] if kind.startswith(ST_PACKAGE) else kind


def _pooling_mode(path: Path) -> PoolingType:
    settings = json.loads(path.read_text()) if path.is_file() else {}
    named = settings.get("pooling_mode")
    if isinstance(named, list) and len(named) == 1:  # a tuple of one mode, saved as a list
        named = named[0]
    if isinstance(named, str) and named in _MODE_NAMES:
        return _MODE_NAMES[named]
    if named is not None:
        raise ValueError(
            f"{path}: Octavo pools by exactly one of {', '.join(_MODE_NAMES)}; this module "
            f"asks for pooling_mode {named!r}"
        )
    chosen = [kind for flag, kind in _MODES.items() if settings.get(flag)]
    others = [key for key, on in settings.items() if key.startswith("pooling_mode_") and on]
    if len(chosen) != 1 or len(others) != 1:
        raise ValueError(
            f"{path}: Octavo pools by exactly one of last token, mean or CLS; this "
            f"module asks for {others or 'none'}"
        )
    return chosen[0]
