"""Checkpoint formats: branch/prefix handling, per-layer decoding, quantize-on-load, detection."""

from .comfy_quant import decode_comfy_quant, encode_comfy_quant
from .detect import detect_format
from .source import BRANCHES, Source, open_source

__all__ = ["BRANCHES", "Source", "open_source", "decode_comfy_quant", "encode_comfy_quant", "detect_format"]
