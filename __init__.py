"""Ideogram 4.0 W8A8 INT8 for ComfyUI: fused Triton INT8 GEMM, caption builder, GEMM-path panel.

Importing this package outside ComfyUI is cheap and side-effect free: it does not import
`comfy`, initialise CUDA or touch the network. ComfyUI finds ``comfy_entrypoint`` (V3 node API)
and ``WEB_DIRECTORY``; the nodes module, which needs ComfyUI, is imported only when ComfyUI
calls the entry point.
"""

__version__ = "0.1.0"

# Every .js under this folder is loaded by the ComfyUI frontend.
WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    """V3 entry point called by ComfyUI's custom-node loader; returns a ComfyExtension."""
    from .nodes import extension

    return await extension.comfy_entrypoint()


__all__ = ["WEB_DIRECTORY", "comfy_entrypoint", "__version__"]
