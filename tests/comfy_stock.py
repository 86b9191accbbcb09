"""ComfyUI's own Ideogram 4 DiT for a config of ours, for the scripts that run inside ComfyUI's Python
(``comfy_nodes_script.py``, ``comfy_parity_script.py``; ComfyUI must be importable)."""

from __future__ import annotations

# the model's size arguments, each read from the Ideogram4Config field of the same name or of the name given here
SIZE_ARGS = (
    "in_channels",
    "num_layers",
    "num_attention_heads",
    "attention_head_dim",
    "intermediate_size",
    "adaln_dim",
    "llm_features_dim",
    "rope_theta",
    "mrope_section",
    "norm_eps",
)
OUR_NAMES = {"num_attention_heads": "num_heads", "attention_head_dim": "head_dim"}


def stock_sizes(cfg, leave_out=()) -> dict:
    """The stock DiT's size arguments (ComfyUI's names) with the values of ``cfg``, but those in ``leave_out``."""
    return {arg: getattr(cfg, OUR_NAMES.get(arg, arg)) for arg in SIZE_ARGS if arg not in leave_out}


def stock_dit(cfg, operations=None, **kw):
    """``comfy.ldm.ideogram4.model.Ideogram4Transformer2DModel`` with the sizes of ``cfg`` (an ``Ideogram4Config``),
    fp32, built with ``operations`` (default ``comfy.ops.disable_weight_init``); ``kw``: more of its arguments
    (e.g. ``device="meta"``)."""
    import comfy.ops
    import torch
    from comfy.ldm.ideogram4.model import Ideogram4Transformer2DModel

    return Ideogram4Transformer2DModel(
        **stock_sizes(cfg),
        dtype=torch.float32,
        operations=comfy.ops.disable_weight_init if operations is None else operations,
        **kw,
    )
