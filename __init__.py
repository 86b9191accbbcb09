"""Ideogram 4.0 W8A8 INT8 for ComfyUI: fused Triton INT8 GEMM, caption builder, GEMM-path panel.

Importing this package outside ComfyUI is cheap and side-effect free: it does not import
`comfy`, initialise CUDA or touch the network. ComfyUI finds ``comfy_entrypoint`` (V3 node API)
and ``WEB_DIRECTORY``; the nodes module, which needs ComfyUI, is imported only when ComfyUI
calls the entry point.
"""

# ComfyUI and pip import this file as the package. pytest 9 also imports it to set the checkout's root up as a package,
# and where the checkout's folder is no Python name (git's default clone folder, comfyui-ideogram4-int8) it runs it
# as a bare module without a parent package: the relative import and the lazy names are skipped there (no test
# needs them; the tests import the installed comfyui_ideogram4_int8).
if __package__:
    from .ideogram4.lazy import lazy_getattr

__version__ = "0.1.0"

# Every .js under this folder is loaded by the ComfyUI frontend.
WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    """V3 entry point called by ComfyUI's custom-node loader; returns a ComfyExtension."""
    from .nodes import extension, status_report

    status_report.set_pack_version(__version__)
    return await extension.comfy_entrypoint()


# The pack's error types, importable under the name ComfyUI shows for them (comfyui_ideogram4_int8.<Name>, see
# ideogram4/errors.py: public_error). Loaded on first use: importing the package stays cheap.
_ERRORS = {
    **dict.fromkeys(
        (
            "CheckpointError",
            "NotSafetensorsError",
            "MissingBranchError",
            "MissingKeysError",
            "TensorMismatchError",
            "BaseMismatchError",
            "UnsupportedFormatError",
            "HubError",
        ),
        ".ideogram4.errors",
    ),
    "SamplingArgumentError": ".ideogram4.sampling_args",
    "CaptionError": ".ideogram4.captions.problems",
}


if __package__:
    __getattr__ = lazy_getattr(__name__, _ERRORS)


__all__ = ["WEB_DIRECTORY", "comfy_entrypoint", "__version__", *_ERRORS]
