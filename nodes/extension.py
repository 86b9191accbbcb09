"""The pack's ComfyExtension: the list of V3 nodes ComfyUI registers."""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io


class Ideogram4Int8Extension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return []


async def comfy_entrypoint() -> Ideogram4Int8Extension:
    return Ideogram4Int8Extension()
