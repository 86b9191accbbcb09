"""The pack's ComfyExtension: collects the V3 nodes of every node module.

Each module below exports ``NODES`` (a list of ``io.ComfyNode`` classes) and may export
``async def on_load()`` (e.g. to register server routes). The modules are imported one by one: a
module that fails to import (say, a ComfyUI internal that the loader needs moved in a newer ComfyUI)
takes only its own nodes away. The failure is logged at ERROR level with the module, the reason
and the traceback; the other modules' nodes (the caption nodes need nothing but JSON) still register.

The node API is ComfyUI's versioned V3 API ``comfy_api.v0_0_2`` (the newest versioned one in
ComfyUI 0.33), not ``comfy_api.latest``, which may change under us.
"""

from __future__ import annotations

import importlib
import logging

from comfy_api.v0_0_2 import ComfyExtension, io

logger = logging.getLogger(__name__)

NODE_MODULES = (
    "loader_nodes",
    "patch_nodes",
    "sampler_nodes",
    "caption_nodes",
    "status_nodes",
    "demo_nodes",
    "branch_device_nodes",
)


def import_node_modules(names=None, package: str | None = None) -> tuple[list, dict[str, str]]:
    """Import each node module on its own: (modules that imported, {module name: why another did not})."""
    names = NODE_MODULES if names is None else names
    package = package or __package__
    modules, failed = [], {}
    for name in names:
        try:
            modules.append(importlib.import_module(f"{package}.{name}"))
        except Exception as exc:  # noqa: BLE001 - one broken module must not take the others with it
            failed[name] = f"{type(exc).__name__}: {exc}"
            logger.error(
                "Ideogram 4 INT8: node module %r failed to import, its nodes are not registered (%s); "
                "the pack's other nodes still load",
                name,
                failed[name],
                exc_info=True,
            )
    return modules, failed


class Ideogram4Int8Extension(ComfyExtension):
    def __init__(self) -> None:
        self._modules: list | None = None
        self.failed: dict[str, str] = {}

    def modules(self) -> list:
        if self._modules is None:  # imported once: a failure is logged once, not per call
            self._modules, self.failed = import_node_modules()
        return self._modules

    async def on_load(self) -> None:
        for module in self.modules():
            hook = getattr(module, "on_load", None)
            if hook is None:
                continue
            try:
                await hook()
            except Exception:  # noqa: BLE001 - e.g. a route that cannot register; the nodes still work
                logger.error("Ideogram 4 INT8: on_load of node module %r failed", module.__name__, exc_info=True)

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        nodes: list[type[io.ComfyNode]] = []
        for module in self.modules():
            nodes.extend(module.NODES)
        return nodes


async def comfy_entrypoint() -> Ideogram4Int8Extension:
    return Ideogram4Int8Extension()
