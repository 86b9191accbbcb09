"""Errors raised for bad checkpoints and bad model inputs.

Every message names the file, the key (or field), what was expected, what was found, and how to
fix it, so a ComfyUI user can act on it without reading the code.
"""

from __future__ import annotations

import os

# The importable name of the pack (pyproject maps it to the repository root, which re-exports every class marked
# below). ComfyUI shows an error's type as ``<class.__module__>.<class name>``, and it imports a custom node package
# under its folder path, so without this a user would read ".../custom_nodes/comfyui_ideogram4_int8.ideogram4.
# sampling_args.SamplingArgumentError" instead of "comfyui_ideogram4_int8.SamplingArgumentError".
PUBLIC_MODULE = "comfyui_ideogram4_int8"


def public_error(cls):
    """Class decorator: the exception's type reads ``comfyui_ideogram4_int8.<Name>`` wherever it is shown."""
    cls.__module__ = PUBLIC_MODULE
    return cls


@public_error
class CheckpointError(ValueError):
    """A checkpoint cannot be read as an Ideogram 4 branch.

    Attributes:
        file: the file (or "<state dict>") the problem is in.
        key: the tensor key or field, or None when the problem is the file itself.
        expected / found: short descriptions, or None.
        fix: what the user can do about it, or None.
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | os.PathLike | None = None,
        key: str | None = None,
        expected: str | None = None,
        found: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = str(file) if file is not None else None
        self.key = key
        self.expected = expected
        self.found = found
        self.fix = fix
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(f"{self.file}")
        if self.key is not None:
            parts.append(f"key {self.key!r}")
        head = ": ".join(parts)
        msg = f"{head}: {self.problem}" if head else self.problem
        if self.expected is not None or self.found is not None:
            msg += f" (expected {self.expected if self.expected is not None else '?'}"
            msg += f", found {self.found if self.found is not None else '?'})"
        if self.fix:
            msg += f". Fix: {self.fix}"
        return msg


@public_error
class NotSafetensorsError(CheckpointError):
    """The file is not a (complete) safetensors file."""


@public_error
class MissingBranchError(CheckpointError):
    """A two-branch file has no tensors under the requested branch prefix."""


@public_error
class MissingKeysError(CheckpointError):
    """Tensors the architecture needs are in neither the file nor the base checkpoint."""


@public_error
class TensorMismatchError(CheckpointError):
    """A tensor has the wrong shape or dtype, or a quantized weight lacks its scale."""


@public_error
class BaseMismatchError(CheckpointError):
    """The base checkpoint does not belong to the same architecture as the main file."""


@public_error
class UnsupportedFormatError(CheckpointError):
    """A layer is stored in a quantization format this pack cannot read."""


@public_error
class HubError(CheckpointError):
    """A Hugging Face hub download was requested and failed."""


# The files a user should pick instead of one that is not an Ideogram 4 diffusion model (loader node, read_branch).
PICK_IDEOGRAM4 = (
    "pick an Ideogram 4 diffusion model: the W8A8 file ideogram4-int8-w8a8.safetensors (both branches), "
    "or ComfyUI's ideogram4_fp8_scaled.safetensors with ideogram4_unconditional_fp8_scaled.safetensors "
    "(also as int8_convrot or bf16); text encoders, VAEs and other models do not go here"
)


def describe(t) -> str:
    """'int8 [4608, 128]' for a tensor; 'dtype [shape]' for (dtype, shape) pairs."""
    if isinstance(t, tuple) and len(t) == 2:
        dtype, shape = t
    else:
        dtype, shape = t.dtype, tuple(t.shape)
    name = str(dtype).replace("torch.", "")
    return f"{name} {list(shape)}"


def few(keys, n: int = 5) -> str:
    """The first n keys and how many more, for messages about many keys."""
    keys = sorted(keys)
    head = ", ".join(keys[:n])
    return head + (f" … and {len(keys) - n} more" if len(keys) > n else "")


class DeviceUnavailableError(CheckpointError):
    """The device the tensors should go to does not exist here (e.g. ``device="cuda"`` without a CUDA GPU)."""
