"""How a model node tells the GEMM-path panel about a load or a run: the running node's id and a publish that
never breaks the node.

``status_nodes.publish`` sends the event; it is imported when called, so a node module still loads and runs where
``status_nodes`` cannot import (a node module that fails to import takes only its own nodes away).
"""

from __future__ import annotations

import logging

log = logging.getLogger("comfyui_ideogram4_int8")


def node_id_of(node_cls) -> str | None:
    """The running node's id (V3 hidden ``unique_id``); None when called outside ComfyUI's executor."""
    return getattr(getattr(node_cls, "hidden", None), "unique_id", None)


def publish(event: str, *args, **kwargs) -> None:
    """Tell the GEMM-path panel: ``status_nodes.publish`` with these arguments, when that module imports; never
    raises (a node module that fails to import takes only its own nodes away)."""
    try:
        from . import status_nodes

        fn = getattr(status_nodes, "publish", None)
        if fn is not None:
            fn(event, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the panel must never break a load or a run
        log.debug("ideogram4-int8: panel publish(%r) failed: %s", event, exc)


__all__ = ["node_id_of", "publish"]
