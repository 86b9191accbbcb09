"""A pack MODEL keeps the host tensor of every weight it put on the card, so that unloading it drops the card copy.

ComfyUI unloads a legacy ModelPatcher by moving each weight back to the host (``unpatch_model``'s ``.to``, or
``partially_unload`` module by module): new pageable memory filled by synchronous copies. At a prompt change on a
16 GB card (the text encoder loads between two images) that took seconds per branch, where native ComfyUI, whose
dynamic VRAM keeps host copies of every weight, drops its card copies (docs/performance.md, "A prompt change at
16 GB"). The staged upload (``weight_upload``) hands each host tensor it copied to ``remember``; ``restore`` puts
them back in place of the card tensors before ComfyUI's unload, whose ``.to`` then copies nothing.

* Never for a LoRA-patched weight (ComfyUI backs up the original and merges on the card; its backup is restored).
* The host copies are the tensors the load read, so a weight's host copy is the weight ComfyUI would bring back.
* Host copies that streaming pinned stay pinned while the model lives (the next plan streams them again without
  pinning, ``streaming_patcher``); they are unpinned when the model is collected.
* The experiment ``host-copies=off`` frees each host tensor after its upload, as ComfyUI does (A/B); so does a host
  short of memory (less than ``MIN_FREE_RAM`` available), where the copies would push others out.
"""

from __future__ import annotations

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


def unloads_to_host(patcher) -> bool:
    """ComfyUI unloads this MODEL to host memory (not under ``--gpu-only`` / ``--highvram``, where its offload
    device is the card and a host copy would only hold RAM)."""
    return torch.device(patcher.offload_device).type == "cpu"


def remember(patcher, items) -> int:
    """Keep the host tensor of each ``(key, tensor, host data)`` about to go to the card; returns the bytes kept."""
    if not enabled() or not unloads_to_host(patcher) or psutil.virtual_memory().available < MIN_FREE_RAM:
        return 0
    copies, kept = _copies(patcher.model), 0
    for key, t, data in items:
        if data.device.type == "cpu" and key not in patcher.patches:
            copies[key] = _kept(t)
            kept += data.nbytes
    return kept


def _untouched(patcher, key: str) -> bool:
    """No patch applies to ``key`` and ComfyUI holds no backup of it (a LoRA merged on the card, or a hook's patch
    applied in place)."""
    return key not in patcher.patches and key not in patcher.backup and key not in patcher.hook_backup


def host_of(patcher, key: str, now: torch.Tensor) -> torch.Tensor | None:
    """The kept host copy of the weight ``key`` now on the card, when it is still that weight's; else None."""
    host = _copies(patcher.model).get(key)
    if host is None or not _untouched(patcher, key) or not _matches(host, now):
        return None
    return host


def kept_data(patcher) -> set[int]:
    """The host data addresses of the kept copies that are still their weights' (what may stay pinned)."""
    return {_data(host).data_ptr() for key, host in _copies(patcher.model).items() if _untouched(patcher, key)}


def _is_copy(host: torch.Tensor, now: torch.Tensor) -> bool:
    return _data(host).data_ptr() == _data(now).data_ptr()


def _on(device: torch.device, t: torch.Tensor) -> bool:
    d = _data(t).device
    return d.type == device.type and (d.index or 0) == (device.index or 0)


def _card_tensors(patcher):
    """(key, module, name, tensor) of every parameter and buffer of the model on its load device, shared ones under
    each of their names."""
    device = torch.device(patcher.load_device)
    for prefix, module in patcher.model.named_modules():
        for name, t in (*module._parameters.items(), *module._buffers.items()):
            if t is not None and _on(device, t):
                yield (f"{prefix}.{name}" if prefix else name), module, name, t


def _hosts_by_card_address(patcher, tensors) -> dict[int, torch.Tensor]:
    """Card data address -> the host copy of the tensor there (a tensor two modules share has one copy, under the
    first name the upload met it by)."""
    out = {}
    for key, _, _, t in tensors:
        host = host_of(patcher, key, t)
        if host is not None and not _is_copy(host, t):
            out.setdefault(_data(t).data_ptr(), host)
    return out


def restore(patcher) -> int:
    """Put the kept host copies back in place of their card tensors (before ComfyUI unloads the model); only card
    tensors are swapped (a weight ComfyUI itself moved back and pinned stays ComfyUI's). Returns the bytes of card
    tensors dropped."""
    tensors = list(_card_tensors(patcher))
    hosts = _hosts_by_card_address(patcher, tensors)
    dropped, seen = 0, set()
    for _, module, name, t in tensors:
        host = hosts.get(_data(t).data_ptr())
        if host is None or not _matches(host, t):
            continue
        if name in module._parameters:
            module._parameters[name] = torch.nn.Parameter(host, requires_grad=False)
        else:
            module._buffers[name] = host
        if _data(t).data_ptr() not in seen:
            seen.add(_data(t).data_ptr())
            dropped += _data(t).nbytes
    return dropped


def covers(patcher) -> bool:
    """Whether the tensors of the model on its load device have kept host copies, all but small ones (computed
    vectors, ``UNCOVERED_SLACK``): unloading it whole then costs no copy of a weight (``streaming_patcher`` then lets
    ComfyUI unload it whole instead of moving part of it back)."""
    if not _copies(patcher.model) or not unloads_to_host(patcher):
        return False
    tensors = list(_card_tensors(patcher))
    hosts = _hosts_by_card_address(patcher, tensors)
    uncovered = {_data(t).data_ptr(): _data(t).nbytes for *_, t in tensors if _data(t).data_ptr() not in hosts}
    return sum(uncovered.values()) <= UNCOVERED_SLACK


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
    "unloads_to_host",
]
