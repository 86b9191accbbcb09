"""What a streamed block of a ComfyUI Ideogram 4 MODEL crosses the bus as, and how its modules are pointed at a slot.

``ideogram4.streaming.block_pieces`` cuts a block into pieces from its module names; what only ComfyUI's modules
tell is here: which linears stream (the pack's Linears, int8 or protected bf16), whether the block's FFN is ComfyUI's
``FeedForward`` (called as a module, w1 and w3 before w2, the pack's fused pair and its split fallback alike: then
the block streams as three pieces), and how a weight is rebuilt on a slot (an int8 ``QuantizedTensor`` keeps its
layout and scale). ``streaming_patcher`` decides what streams and when.
"""

from __future__ import annotations

import torch
from comfy.ldm.lumina.model import FeedForward
from comfy.quant_ops import QuantizedTensor

from ...ideogram4 import streaming


def streamable(block: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The block's linears whose weights stream: the pack's Linears (int8, or protected bf16)."""
    return [(n, m) for n, m in block.named_modules() if getattr(m, "ideogram4_int8", False) and m.weight is not None]


def host_data(w) -> torch.Tensor:
    """The tensor that streams for weight ``w``: an int8 weight's data, or the float weight itself."""
    return w._qdata if isinstance(w, QuantizedTensor) else w.data


def with_host_data(w, data: torch.Tensor):
    """``w`` with ``data`` in place of the tensor that streams for it (``host_data``)."""
    return QuantizedTensor(data, w._layout_cls, w._params) if isinstance(w, QuantizedTensor) else data


def weight_bytes(m) -> int:
    data = host_data(m.weight)
    return data.numel() * data.element_size()


def pieces(block: torch.nn.Module, split: bool = True) -> list[streaming.Piece]:
    """The pieces ``block`` streams as: three ("attention", "gate_up", "down") when ``split`` and its FFN is ComfyUI's
    FeedForward, else the whole block as one."""
    split = split and isinstance(getattr(block, streaming.FFN, None), FeedForward)
    return streaming.block_pieces(block, streamable(block), split)


def piece_bytes(block: torch.nn.Module, split: bool = True) -> list[int]:
    """The slot bytes of each piece of ``block`` (tensors aligned as the streamer lays them out in a slot)."""
    return [sum(streaming.aligned(weight_bytes(m)) for _, m in p.modules) for p in pieces(block, split)]


def unit(index: int, piece: streaming.Piece, device: torch.device, cache: dict) -> streaming.StreamUnit:
    """The stream unit of ``piece`` of block ``index``: its host weights, and the bindings of its modules to a slot's
    views (the Parameters made from a slot's views are kept in ``cache``, by the views' id)."""
    modules = [m for _, m in piece.modules]
    hosts = [m.weight for m in modules]
    # a quantized weight's small tensors (its scales) go to the device now, once: made at the first bind, they were a
    # copy from pageable memory inside the first pass, which a CUDA graph captured at that pass cannot hold
    params = [h._params.to_device(device) if isinstance(h, QuantizedTensor) else None for h in hosts]

    # the closures hold the cache and the device, not the model's stream: a cycle through it kept every replaced
    # plan's slots on the card until a garbage collection (gigabytes held on a small card, ComfyUI asking for more
    # each time and the branches shrinking pass after pass)
    def device_params(views):
        key = id(views)
        if key not in cache:
            out = []
            for host, view, on_device in zip(hosts, views, params, strict=True):
                t = view if on_device is None else QuantizedTensor(view, host._layout_cls, on_device)
                out.append(torch.nn.Parameter(t, requires_grad=False))
            cache[key] = out
        return cache[key]

    def bind(views):
        for m, p in zip(modules, device_params(views), strict=True):
            m._parameters["weight"] = p
            m.comfy_cast_weights = False

    def unbind():
        for m, host in zip(modules, hosts, strict=True):
            m._parameters["weight"] = host
            m.comfy_cast_weights = True  # a stray call outside its piece casts through ComfyUI: slow, correct

    data = [host_data(h) for h in hosts]
    pinned = [d.is_pinned() for d in data]
    for m in modules:
        m.comfy_cast_weights = True
    return streaming.StreamUnit(index, data, bind, unbind, pinned, piece.name)


__all__ = ["streamable", "host_data", "with_host_data", "weight_bytes", "pieces", "piece_bytes", "unit"]
