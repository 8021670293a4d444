"""Lightning ships under two names: ``pytorch_lightning`` and ``lightning.pytorch`` (the unified
``lightning`` package, ``import lightning as L``). Each holds its own copy of every class, so a
``lightning.pytorch.callbacks.Timer`` is not a ``pytorch_lightning.callbacks.Timer`` and
``pytorch_lightning``'s helpers refuse a ``lightning.pytorch`` module ("Expected a parent").

The callbacks work under either: every check of a Lightning class or helper goes through this
module, which answers for the namespace the object at hand comes from — the user's ``Trainer``,
``LightningModule`` or callback — not for the one this package happens to import.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType
from typing import Any

__all__ = ["NAMESPACES", "classes", "is_overridden", "namespace_of"]

#: the names Lightning is installed under; the first is the one this package depends on
NAMESPACES = ("pytorch_lightning", "lightning.pytorch")


@cache
def _installed() -> tuple[ModuleType, ...]:
    found = []
    for name in NAMESPACES:
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            continue
    return tuple(found)


def namespace_of(obj: Any) -> ModuleType:
    """The Lightning package that ``obj``'s class (a ``Trainer``, a ``LightningModule``, a
    ``LightningDataModule``, a callback) derives from: ``pytorch_lightning`` where none does."""
    for cls in type(obj).__mro__:
        for name in NAMESPACES:
            if cls.__module__ == name or cls.__module__.startswith(name + "."):
                return importlib.import_module(name)
    return importlib.import_module(NAMESPACES[0])


@cache
def classes(path: str) -> tuple[type, ...]:
    """The class at ``path`` (relative to the package, e.g. ``"callbacks.Timer"``) from every
    installed Lightning namespace: for ``isinstance`` checks that hold for either."""
    module_path, _, name = path.rpartition(".")
    found = []
    for package in _installed():
        try:
            module = importlib.import_module(f"{package.__name__}.{module_path}")
        except ImportError:  # e.g. a progress bar module whose optional dependency is missing
            continue
        if hasattr(module, name):
            found.append(getattr(module, name))
    return tuple(found)


def is_overridden(method: str, instance: Any) -> bool:
    """Lightning's ``is_overridden`` from ``instance``'s own namespace (the other one raises
    "Expected a parent")."""
    helpers = importlib.import_module(f"{namespace_of(instance).__name__}.utilities.model_helpers")
    return bool(helpers.is_overridden(method, instance))
