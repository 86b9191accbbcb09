"""A package's module ``__getattr__`` that imports its public names on first use (PEP 562)."""

from __future__ import annotations

import importlib


def lazy_getattr(package: str, where: dict[str, str], keep: dict | None = None):
    """``__getattr__`` for ``package``: ``name`` is read from the module ``where[name]`` (relative to ``package``)
    when first asked for; with ``keep`` (the package's ``globals()``) it is stored there for the next time."""

    def __getattr__(name):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        if keep is not None:
            keep[name] = value
        return value

    return __getattr__
