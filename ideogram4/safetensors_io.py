"""Streaming safetensors I/O: one tensor at a time in both directions, never the whole file.

Reading goes through ``safetensors.safe_open`` (lazy, memory-mapped); errors become
``CheckpointError``s that name the file. Writing streams tensors into the format by hand
(8-byte header length, JSON header, raw little-endian data) so a 20 GB checkpoint can be written
from a machine whose RAM holds one tensor, and writes go to a temporary name renamed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import struct
from collections.abc import Callable

import torch

from .errors import NotSafetensorsError

DTYPE_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")


class Header:
    """Keys, dtypes and shapes of a safetensors file, read without loading tensor data."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = pathlib.Path(path)
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        self.metadata: dict[str, str] = {}
        with open_safetensors(self.path) as f:
            self.metadata = dict(f.metadata() or {})
            for key in f.keys():
                sl = f.get_slice(key)
                code = sl.get_dtype()
                dtype = CODE_DTYPES.get(code)
                if dtype is None:
                    raise NotSafetensorsError(f"tensor dtype {code} is not supported", file=self.path, key=key)
                self.entries[key] = (dtype, tuple(int(d) for d in sl.get_shape()))

    def keys(self):
        return self.entries.keys()

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def dtype(self, key: str) -> torch.dtype:
        return self.entries[key][0]

    def shape(self, key: str) -> tuple[int, ...]:
        return self.entries[key][1]


DOWNLOAD_AGAIN = "download the file again (or copy it again) and pick it once the download has finished"


def _first_bytes(path: pathlib.Path, n: int = 64) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def _not_safetensors(
    path: pathlib.Path,
    exc: Exception | None,
    why: str = "",
    truncated: bool = False,
) -> NotSafetensorsError:
    """The error for a file that cannot be read as safetensors: what it looks like, and the one fix that applies."""
    detail = why or (f"{type(exc).__name__}: {exc}" if exc else "")
    size = path.stat().st_size if path.exists() else None
    head = _first_bytes(path).lstrip().lower()
    if path.suffix.lower() in PICKLE_SUFFIXES:
        problem = "not a safetensors file" + (f" ({detail})" if detail else "")
        fix = (
            "pickle checkpoints (.ckpt/.pt/.bin) are never loaded by this pack; convert the file to safetensors "
            "with a trusted tool first"
        )
    elif truncated:
        problem = f"the file is truncated (incomplete, e.g. an interrupted download): {detail}"
        fix = DOWNLOAD_AGAIN
    elif head.startswith(b"version https://git-lfs"):
        problem = "the file is a Git LFS pointer (a small text file that stands in for the model), not the model"
        fix = "download the real file (the download button on the model page, or `git lfs pull` in a clone)"
    elif head.startswith((b"<!doctype", b"<html", b"<?xml", b'{"error')):
        problem = "the file is a web page or an error message saved under this name, not the model"
        fix = DOWNLOAD_AGAIN + " (for a gated Hugging Face repository: accept its terms and log in first)"
    elif path.suffix.lower() == ".safetensors":
        problem = "the file is damaged: it is not readable as safetensors" + (f" ({detail})" if detail else "")
        fix = DOWNLOAD_AGAIN
    else:
        problem = "not a safetensors file" + (f" ({detail})" if detail else "")
        fix = "pick a .safetensors file"
    return NotSafetensorsError(
        problem,
        file=path,
        expected="an 8-byte header length, a JSON header and the complete tensor data",
        found=f"{size} bytes" if size is not None else "no file",
        fix=fix,
    )


@contextlib.contextmanager
def open_safetensors(path: str | os.PathLike, device: str = "cpu"):
    """``safe_open`` with every failure turned into a NotSafetensorsError naming the file."""
    from safetensors import safe_open

    path = pathlib.Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.safetensors"))
        raise NotSafetensorsError(
            "this is a folder, not a file",
            file=path,
            expected="a .safetensors file",
            found="a folder" + (f" holding {', '.join(inside[:3])}" if inside else " with no .safetensors file"),
            fix="add the file's name to the path" + (f", e.g. {path / inside[0]}" if inside else ""),
        )
    if not path.is_file():
        raise NotSafetensorsError(
            "file not found",
            file=path,
            fix="check the path (to download from the Hugging Face hub pass hf://<owner>/<repo>/<file>)",
        )
    _check_length(path)
    try:
        handle = safe_open(str(path), framework="pt", device=str(device))
    except Exception as exc:  # safetensors raises its own SafetensorError / OSError
        raise _not_safetensors(path, exc) from None
    with handle as f:
        yield f


def _check_length(path: pathlib.Path) -> None:
    """Catch a truncated file before safetensors maps it (its error would not say 'truncated')."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _not_safetensors(path, None, f"only {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 1024 * 1024:
            raise _not_safetensors(path, None, f"its first 8 bytes give a header length of {n} bytes")
        if n > size - 8:  # a plausible header cut off: the file ends inside it
            raise _not_safetensors(
                path, None, f"the header needs {n + 8} bytes but the file has {size}", truncated=True
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_safetensors(path, None, f"the header is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise _not_safetensors(path, None, "the header is not a JSON object")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise _not_safetensors(path, None, f"header entry {key!r} has no data_offsets") from None
    if 8 + n + end > size:
        raise _not_safetensors(
            path,
            None,
            f"the header describes {8 + n + end} bytes but the file has {size}",
            truncated=True,
        )


# -- writing -----------------------------------------------------------------------------------


def _tensor_bytes(t: torch.Tensor):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy()


def write_safetensors(
    path: str | os.PathLike,
    specs: dict[str, tuple[torch.dtype, tuple[int, ...]]],
    produce: Callable[[str], torch.Tensor],
    metadata: dict[str, str] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> pathlib.Path:
    """Write a safetensors file tensor by tensor.

    Args:
        specs: every key with its dtype and shape (the header is written first).
        produce: called once per key, in sorted key order; returns the tensor (any device).
        metadata: string-to-string ``__metadata__``.
    The file appears under its name only when complete (written to ``<name>.partial`` first).
    """
    path = pathlib.Path(path)
    header: dict = {}
    offset = 0
    order = sorted(specs)
    for key in order:
        dtype, shape = specs[key]
        if dtype not in DTYPE_CODES:
            raise ValueError(f"write_safetensors: {key}: dtype {dtype} cannot be stored")
        n = 1
        for d in shape:
            n *= int(d)
        size = n * torch.empty((), dtype=dtype).element_size()
        header[key] = {
            "dtype": DTYPE_CODES[dtype],
            "shape": [int(d) for d in shape],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)))
            fh.write(raw)
            for i, key in enumerate(order):
                t = produce(key)
                dtype, shape = specs[key]
                if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                    raise ValueError(
                        f"write_safetensors: {key}: produced {t.dtype} {list(t.shape)}, "
                        f"header says {dtype} {list(shape)}"
                    )
                fh.write(_tensor_bytes(t))
                del t
                if progress is not None:
                    progress(i + 1, len(order), key)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def save_tensors(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> pathlib.Path:
    """Write an in-memory dict of tensors (small files)."""
    specs = {k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}
    return write_safetensors(path, specs, tensors.__getitem__, metadata)
