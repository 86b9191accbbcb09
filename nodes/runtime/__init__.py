"""What makes ComfyUI's own Ideogram 4 MODEL run the pack's kernels: no nodes (those are in ``nodes/``).

The custom ops and the MODEL built with them (``int8_ops``, ``native_model``), the ComfyUI modules swapped for fused
ones (``ffn_fusion``, ``qk_rope``, ``block_norms``, ``swapped_blocks``), the ModelPatcher, its weight streaming and
upload (``streaming_patcher``, ``stream_pieces``, ``weight_upload``), per-run machinery (``cuda_graphs``,
``attention_override``, ``resident_conds``) and the check that each layer ran the pack's op (``op_coverage``,
``after_forward``). Imports ComfyUI (hence under ``nodes/``); never imports a node module.
"""
