"""ComfyUI's own Ideogram 4 DiT for a config of ours, for the scripts that run inside ComfyUI's Python
(``comfy_nodes_script.py``, ``comfy_parity_script.py``; ComfyUI must be importable)."""

from __future__ import annotations


def stock_dit(cfg, operations=None, **kw):
    """``comfy.ldm.ideogram4.model.Ideogram4Transformer2DModel`` with the sizes of ``cfg`` (an ``Ideogram4Config``),
    fp32, built with ``operations`` (default ``comfy.ops.disable_weight_init``); ``kw``: more of its arguments
    (e.g. ``device="meta"``)."""
    import comfy.ops
    import torch
    from comfy.ldm.ideogram4.model import Ideogram4Transformer2DModel

    return Ideogram4Transformer2DModel(
        in_channels=cfg.in_channels,
        num_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        attention_head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        adaln_dim=cfg.adaln_dim,
        llm_features_dim=cfg.llm_features_dim,
        rope_theta=cfg.rope_theta,
        mrope_section=cfg.mrope_section,
        norm_eps=cfg.norm_eps,
        dtype=torch.float32,
        operations=comfy.ops.disable_weight_init if operations is None else operations,
        **kw,
    )
