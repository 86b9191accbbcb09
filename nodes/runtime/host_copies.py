"""A pack MODEL keeps the host tensor of every weight it put on the card, so that unloading it drops the card copy.

ComfyUI unloads a legacy ModelPatcher by moving each weight back to the host (``unpatch_model``'s ``.to``, or
``partially_unload`` module by module): new pageable memory filled by synchronous copies. On an H200 capped at
16 GB a prompt change (the text encoder loads between two images) moved 6.6 GiB of one branch back in 6.3 s and
re-planned the other in 5.4 s, where native ComfyUI, whose dynamic VRAM keeps host copies of every weight, encoded
in 0.5 s. The staged upload (``weight_upload``) hands each host tensor it copied to ``remember``; ``restore`` puts
them back in place of the card tensors before ComfyUI's unload, whose ``.to`` then copies nothing.

* Never for a LoRA-patched weight (ComfyUI backs up the original and merges on the card; its backup is restored).
* The host copies are the tensors the load read, so a weight's host copy is the weight ComfyUI would bring back.
* Host copies that streaming pinned stay pinned while the model lives (the next plan streams them again without
  pinning, ``streaming_patcher``); they are unpinned when the model is collected.
* The experiment ``host-copies=off`` frees each host tensor after its upload, as ComfyUI does (A/B); so does a host
  short of memory (less than ``MIN_FREE_RAM`` available), where the copies would push others out.
"""

from __future__ import annotations

import itertools

import psutil
import torch
from comfy.quant_ops import QuantizedTensor

from ...kernels import settings

EXPERIMENT = "host-copies"
MIN_FREE_RAM = 4 * 2**30  # bytes of host memory that stay available for everything else
UNCOVERED_SLACK = 64 * 2**20  # bytes on the card without a host copy that a whole unload may still move back


def enabled() -> bool:
    return settings.experiment(EXPERIMENT) != "off"


def _copies(model) -> dict:
    """The model's kept host copies by key; none while the experiment is off (kept ones are then ignored)."""
    if not enabled():
        return {}
    if not hasattr(model, "ideogram4_host_copies"):
        model.ideogram4_host_copies = {}
    return model.ideogram4_host_copies


def _data(t: torch.Tensor) -> torch.Tensor:
    return t._qdata if isinstance(t, QuantizedTensor) else t


def _matches(host: torch.Tensor, now: torch.Tensor) -> bool:
    quantized = isinstance(host, QuantizedTensor)
    return quantized == isinstance(now, QuantizedTensor) and host.dtype == now.dtype and host.shape == now.shape


def _kept(t: torch.Tensor) -> torch.Tensor:
    """A tensor holding ``t``'s host storage that the move to the card leaves alone (torch's ``_apply`` may swap a
    Parameter's data in place)."""
    if isinstance(t, QuantizedTensor):
        return QuantizedTensor(t._qdata, t._layout_cls, t._params)
    return t.detach()


def remember(patcher, items) -> int:
    """Keep the host tensor of each ``(key, tensor, host data)`` about to go to the card; returns the bytes kept."""
    if not enabled() or psutil.virtual_memory().available < MIN_FREE_RAM:
        return 0
    copies, kept = _copies(patcher.model), 0
    for key, t, data in items:
        if data.device.type == "cpu" and key not in patcher.patches:
            copies[key] = _kept(t)
            kept += data.nbytes
    return kept


def _untouched(patcher, key: str) -> bool:
    """No patch applies to ``key`` and ComfyUI holds no backup of it (a LoRA merged on the card)."""
    return key not in patcher.patches and key not in patcher.backup


def host_of(patcher, key: str, now: torch.Tensor) -> torch.Tensor | None:
    """The kept host copy of the weight ``key`` now on the card, when it is still that weight's; else None."""
    host = _copies(patcher.model).get(key)
    if host is None or not _untouched(patcher, key) or not _matches(host, now):
        return None
    return host


def kept_data(patcher) -> set[int]:
    """The host data addresses of the kept copies that are still their weights' (what may stay pinned)."""
    return {_data(host).data_ptr() for key, host in _copies(patcher.model).items() if _untouched(patcher, key)}


def _owner(model, key: str) -> tuple[torch.nn.Module, str]:
    prefix, _, name = key.rpartition(".")
    return (model.get_submodule(prefix) if prefix else model), name


def _is_copy(host: torch.Tensor, now: torch.Tensor) -> bool:
    return _data(host).data_ptr() == _data(now).data_ptr()


def restore(patcher) -> int:
    """Put every kept host copy back in place of its card tensor (before ComfyUI unloads the model); returns the
    bytes of card tensors dropped."""
    dropped = 0
    for key, host in _copies(patcher.model).items():
        try:
            module, name = _owner(patcher.model, key)
        except AttributeError:
            continue
        now = module._parameters.get(name, module._buffers.get(name))
        if now is None or _is_copy(host, now) or host_of(patcher, key, now) is None:
            continue
        if name in module._parameters:
            module._parameters[name] = torch.nn.Parameter(host, requires_grad=False)
        else:
            module._buffers[name] = host
        dropped += _data(now).nbytes
    return dropped


def _on(device: torch.device, t: torch.Tensor) -> bool:
    d = _data(t).device
    return d.type == device.type and (d.index or 0) == (device.index or 0)


def covers(patcher) -> bool:
    """Whether the tensors of the model on its load device have kept host copies, all but small ones (computed
    vectors, ``UNCOVERED_SLACK``): unloading it whole then costs no copy of a weight (``streaming_patcher`` then lets
    ComfyUI unload it whole instead of moving part of it back)."""
    if not _copies(patcher.model):
        return False
    device = torch.device(patcher.load_device)
    tensors = itertools.chain(patcher.model.named_parameters(), patcher.model.named_buffers())
    uncovered = sum(_data(t).nbytes for key, t in tensors if _on(device, t) and host_of(patcher, key, t) is None)
    return uncovered <= UNCOVERED_SLACK


__all__ = [
    "EXPERIMENT",
    "MIN_FREE_RAM",
    "UNCOVERED_SLACK",
    "covers",
    "enabled",
    "host_of",
    "kept_data",
    "remember",
    "restore",
]
