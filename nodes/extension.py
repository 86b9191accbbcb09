"""The pack's ComfyExtension: collects the V3 nodes of every node module.

Each module below exports ``NODES`` (a list of ``io.ComfyNode`` classes) and may export
``async def on_load()`` (e.g. to register server routes). A module that fails to import is a
bug, not something to skip silently: the error propagates and ComfyUI logs it.
"""

from __future__ import annotations

import importlib

from comfy_api.latest import ComfyExtension, io

NODE_MODULES = (
    "loader_nodes",
    "patch_nodes",
    "sampler_nodes",
    "caption_nodes",
    "status_nodes",
)


def _modules():
    return [importlib.import_module(f"{__package__}.{name}") for name in NODE_MODULES]


class Ideogram4Int8Extension(ComfyExtension):
    async def on_load(self) -> None:
        for module in _modules():
            hook = getattr(module, "on_load", None)
            if hook is not None:
                await hook()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        nodes: list[type[io.ComfyNode]] = []
        for module in _modules():
            nodes.extend(module.NODES)
        return nodes


async def comfy_entrypoint() -> Ideogram4Int8Extension:
    return Ideogram4Int8Extension()
