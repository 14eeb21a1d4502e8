"""A package's names imported on first use (PEP 562), so that importing one of its modules
does not import what the package's other names need (torch, the engine)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def names_on_first_use(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: each name of ``exports`` from the module it maps to."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
