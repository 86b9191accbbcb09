"""The pack's small JSON caches of measured answers (the CPU GEMM choice, the attention choice, the kernels'
self-check): one file per kind in the cache folder, ``{"entries": {key: value}}``, written whole through a temporary
file so a reader never sees half of it. A file that cannot be read is an empty cache; one that cannot be written
costs a warning only (a read-only home must not break inference: the answer is kept for the process)."""

from __future__ import annotations

import json
import logging
import os
import pathlib

from .env import cache_dir

log = logging.getLogger("comfyui_ideogram4_int8")


def path_of(name: str) -> pathlib.Path:
    return cache_dir() / name


def read(name: str) -> dict:
    """The entries of cache file ``name`` ({} when it is missing or not a cache)."""
    try:
        doc = json.loads(path_of(name).read_text())
    except (OSError, ValueError):
        return {}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return entries if isinstance(entries, dict) else {}


def write(name: str, entries: dict, what: str) -> None:
    """Replace cache file ``name``'s entries; ``what`` names the cache in the warning when it cannot be written."""
    path = path_of(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"entries": entries}, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:
        log.warning("Ideogram4 INT8: could not write the %s cache %s: %s", what, path.name, exc)


__all__ = ["read", "write", "path_of"]
