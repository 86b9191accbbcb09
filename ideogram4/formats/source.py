"""One checkpoint as a source of tensors for one branch, addressed by official key names.

Handles the branch prefixes of two-branch files (``conditional.`` / ``unconditional.``), the
optional ComfyUI ``model.diffusion_model.`` prefix, and remembers which keys were used so
nothing in a file is silently dropped.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

import torch

from ..errors import MissingBranchError, few
from ..safetensors_io import Header, open_safetensors

BRANCHES = ("conditional", "unconditional")
MODEL_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
# file-level markers that are not tensors of the model
MARKER_KEYS = ("scaled_fp8",)


class Source:
    """Tensors of one branch from a file or an in-memory dict, under official (local) names."""

    def __init__(
        self,
        label: str,
        entries: dict[str, tuple[torch.dtype, tuple[int, ...]]],
        stored: dict[str, str],
        *,
        path: pathlib.Path | None = None,
        tensors: dict | None = None,
        metadata: dict | None = None,
        layout: str = "single",
        markers: dict | None = None,
        prefix: str = "",
    ) -> None:
        self.label = label
        self.entries = entries  # local key -> (dtype, shape)
        self.stored = stored  # local key -> key in the file
        self.path = path
        self.tensors = tensors
        self.metadata = metadata or {}
        self.layout = layout  # "single" | "two-branch"
        self.markers = markers or {}
        self.prefix = prefix  # what the file puts in front of official names (for messages)
        self.used: set[str] = set()
        self._handle = None

    # -- metadata ----------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.entries

    def dtype(self, key: str) -> torch.dtype:
        return self.entries[key][0]

    def shape(self, key: str) -> tuple[int, ...]:
        return self.entries[key][1]

    def use(self, key: str) -> str:
        self.used.add(key)
        return key

    def unused(self) -> list[str]:
        return sorted(k for k in self.entries if k not in self.used)

    def file_key(self, key: str) -> str:
        return self.stored.get(key, self.prefix + key)

    def linear_names(self) -> set[str]:
        out = set()
        for key in self.entries:
            for suffix in (".weight", ".wq"):
                if key.endswith(suffix):
                    out.add(key[: -len(suffix)])
        return out

    # -- data --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def opened(self, device="cpu"):
        if self.path is None:
            yield self
            return
        with open_safetensors(self.path, device=str(device)) as f:
            self._handle = f
            try:
                yield self
            finally:
                self._handle = None

    def load(self, key: str, device=None) -> torch.Tensor:
        """The tensor under local ``key`` (inside ``opened()`` for files)."""
        if self.tensors is not None:
            t = self.tensors[self.stored.get(key, key)]
            return t.to(device) if device is not None else t
        if self._handle is None:
            raise RuntimeError("Source.load outside Source.opened()")
        return self._handle.get_tensor(self.file_key(key))


def _strip_model_prefix(keys: dict[str, str]) -> tuple[dict[str, str], str]:
    for prefix in MODEL_PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            return {k[len(prefix) :]: v for k, v in keys.items()}, prefix
    return keys, ""


def split_branches(keys) -> dict[str, list[str]]:
    """Keys grouped by branch prefix; '' holds keys with no branch prefix."""
    groups: dict[str, list[str]] = {b: [] for b in BRANCHES}
    groups[""] = []
    for k in keys:
        head = k.split(".", 1)[0]
        groups[head if head in BRANCHES and "." in k else ""].append(k)
    return groups


def open_source(src: str | os.PathLike | dict, branch: str, *, role: str = "checkpoint") -> Source:
    """Header-only view of ``src`` (a safetensors path or a dict of tensors) for ``branch``."""
    if branch not in BRANCHES:
        raise ValueError(f"branch must be one of {BRANCHES}; got {branch!r}")
    if isinstance(src, dict):
        label = f"<{role} state dict>"
        raw = {k: (v.dtype, tuple(v.shape)) for k, v in src.items()}
        path, metadata, tensors = None, getattr(src, "metadata", {}) or {}, src
    else:
        path = pathlib.Path(src)
        header = Header(path)
        label = str(path)
        raw, metadata, tensors = header.entries, header.metadata, None
    groups = split_branches(raw)
    present = [b for b in BRANCHES if groups[b]]
    if present:
        layout = "two-branch"
        if branch not in present:
            raise MissingBranchError(
                f"this two-branch file has no {branch!r} branch",
                file=label,
                key=f"{branch}.*",
                expected=f"keys prefixed '{branch}.'",
                found=f"only {', '.join(p + '.*' for p in present)}",
                fix=f"pass a checkpoint that contains the {branch} weights (or the {branch} file of a per-branch pair)",
            )
        chosen = {k[len(branch) + 1 :]: k for k in groups[branch]}
        prefix = branch + "."
        stray = [k for k in groups[""] if k not in MARKER_KEYS]
        if stray:
            raise MissingBranchError(
                "a two-branch file holds keys without a branch prefix",
                file=label,
                key=sorted(stray)[0],
                expected="every key prefixed 'conditional.' or 'unconditional.'",
                found=few(stray),
                fix="re-export the file; keys outside the two branches cannot be assigned to either",
            )
    else:
        layout = "single"
        chosen = {k: k for k in groups[""]}
        prefix = ""
    markers = {k: raw[k] for k in MARKER_KEYS if k in raw}
    for k in MARKER_KEYS:
        chosen.pop(k, None)
    chosen, model_prefix = _strip_model_prefix(chosen)
    entries = {local: raw[stored] for local, stored in chosen.items()}
    return Source(
        label,
        entries,
        chosen,
        path=path,
        tensors=tensors,
        metadata=metadata,
        layout=layout,
        markers=markers,
        prefix=prefix + model_prefix,
    )
