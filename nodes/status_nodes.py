"""The GEMM-path panel's server side: a read-only JSON route and a websocket push.

Routes (registered once, in ``on_load``; ComfyUI also mounts them under ``/api``):

* ``GET /ideogram4_int8/status[?model=<label>][&layers=0|1]`` -> the report of
  ``status_report.py`` (schema: ``status.schema.json``). 400 for a bad or unknown
  parameter, 404 for a model label that has not run; both as ``{"error", "parameter"}``.
* ``POST /ideogram4_int8/timing`` with ``{"enabled": true|false}`` -> switches per-GEMM CUDA-event
  timing (the panel's "time GEMMs" setting uses it). ``IDEOGRAM4_INT8_GEMM_TIMING=1`` in the
  environment switches it on at start.

Websocket event ``ideogram4_int8.status`` (see :func:`publish`) after each model load and each
sampler run, so the panel and the node badges update live.

The report itself is built ComfyUI-free in ``status_report.py``; this module only adapts it to
aiohttp and ``PromptServer``. ``server`` and ``aiohttp`` are imported inside the functions, so
the module imports (and ``publish`` is testable) without a running ComfyUI.
"""

from __future__ import annotations

import logging
import sys

from ..kernels import settings
from ..kernels.registry import REGISTRY
from . import status_report as _status

log = logging.getLogger(__name__)

NODES: list = []

EVENT = _status.EVENT
ROUTE = _status.ROUTE
TIMING_ROUTE = _status.TIMING_ROUTE
EVENTS = ("load", "run", "unload")

_publish_failures = {"count": 0}


def current_prompt_id() -> str | None:
    """The id of the prompt ComfyUI is executing in this thread (None outside its executor)."""
    try:
        from comfy_execution.utils import get_executing_context
    except Exception:  # noqa: BLE001 - older ComfyUI or no ComfyUI: runs are numbered by begin_run()
        return None
    ctx = get_executing_context()
    return getattr(ctx, "prompt_id", None) if ctx is not None else None


def publish(
    event: str,
    models: list[str] | None = None,
    node_id: str | None = None,
    node_type: str | None = None,
    source: dict | None = None,
) -> bool:
    """Push the compact GEMM status to every connected browser. Never raises.

    Call it from the loader node after a model is built (``event="load"``) and from the sampler
    node after each run (``event="run"``, after ``REGISTRY.end_run()``), and with ``"unload"``
    after clearing a model's registry entries.

    Args:
        event: ``"load"``, ``"run"`` or ``"unload"`` (another string is sent as-is, with a warning).
        models: the model labels this event concerns (e.g. ``["conditional", "unconditional"]``);
            None: every model in the registry. The panel uses it to tie a node's badge to its models.
        node_id: the calling node's id (``cls.hidden.unique_id``), so that node's badge shows the
            dominant path of exactly ``models``; None: no node gets a badge from this event.
        node_type: the calling node's type; a badge is shown only on a node of that type.
        source: for a loader, the files it loaded (input name -> name picked): after a reload, a loader whose
            inputs name other files shows no badge.

    The event is remembered per node with the running prompt's id (``status_report.note_node``), so the report's
    ``nodes`` and ``last_prompt_id`` tell a badge of this run from one of an earlier run.

    Sends ``PromptServer.instance.send_sync("ideogram4_int8.status", payload)`` with
    ``payload = {"event", "models", "node_id", "report"}``, where ``report`` is
    ``status_report(include_layers=False)`` (the per-layer table stays on the route).

    Returns:
        True when the message was queued; False when it could not be: quietly (debug log) when no PromptServer
        runs (the pack used in-process), else logged as a warning (the panel catches up on its next refresh).
        A panel must never break sampling.
    """
    try:
        if event not in EVENTS:
            log.warning("Ideogram4 INT8: publish(event=%r) is not one of %s; sent as-is", event, EVENTS)
        if models is not None:
            models = [_status.scrub_text(str(m)) for m in models]
        prompt_id = current_prompt_id()
        _status.note_node(node_id, node_type, str(event), models, prompt_id, source)
        payload = {
            "event": str(event),
            "prompt_id": _status.scrub_text(prompt_id) if prompt_id else None,
            "models": models,
            "node_id": None if node_id is None else str(node_id),
            "report": _status.status_report(include_layers=False),
        }
        server = _prompt_server()
        if server is None:  # in-process use (scripts, benchmarks): no browser to tell
            log.debug("Ideogram4 INT8: no PromptServer; GEMM status %r not pushed", event)
            return False
        server.send_sync(EVENT, payload)
        return True
    except Exception as exc:  # by contract nothing may reach the sampler
        _publish_failures["count"] += 1
        log.warning(
            "Ideogram4 INT8: could not push the GEMM status (%s: %s); the panel updates on its next refresh",
            type(exc).__name__,
            exc,
        )
        return False


def _prompt_server():
    """ComfyUI's running PromptServer, or None. Never imports ``server``: a ComfyUI that serves has imported it, and
    importing it elsewhere may fail (e.g. without sqlalchemy) or start nothing."""
    module = sys.modules.get("server")
    return getattr(getattr(module, "PromptServer", None), "instance", None)


async def _status_handler(request):
    from aiohttp import web

    code, body = _status.status_response(request.query)
    return web.json_response(body, status=code, headers={"Cache-Control": "no-store"})


async def _timing_handler(request):
    from aiohttp import web

    try:
        body = await request.json()
    except Exception:  # any unreadable body is the client's error
        body = None
    try:
        enabled = _status.validate_timing_body(body)
    except _status.StatusQueryError as exc:
        return web.json_response(exc.as_dict(), status=exc.status)
    _status.switch_timing(enabled, "setting")
    log.info("Ideogram4 INT8: per-path GEMM timing %s (panel setting)", "on" if enabled else "off")
    return web.json_response({"enabled": enabled, "switched_by": "setting"})


def register_routes(routes=None) -> list[str]:
    """Add the routes to ``PromptServer.instance.routes`` unless present; returns the ones added."""
    if routes is None:
        from server import PromptServer

        routes = PromptServer.instance.routes
    present = {(getattr(r, "method", None), getattr(r, "path", None)) for r in routes}
    added = []
    for method, path, handler in (("GET", ROUTE, _status_handler), ("POST", TIMING_ROUTE, _timing_handler)):
        if (method, path) in present:
            continue
        routes.route(method, path)(handler)
        added.append(f"{method} {path}")
    return added


def apply_timing_env() -> None:
    """Switch timing as ``IDEOGRAM4_INT8_GEMM_TIMING`` asks (unset: as it is); a value not understood was warned
    about when the settings were read, and the panel lists it."""
    flag = settings.gemm_timing()
    if flag is not None:
        _status.switch_timing(flag, "env")
        log.info("Ideogram4 INT8: per-path GEMM timing %s (%s)", "on" if flag else "off", settings.GEMM_TIMING)


async def on_load() -> None:
    """Register the routes and read the timing switch; a failure here costs the panel, not the nodes."""
    REGISTRY.run_key_source = current_prompt_id  # each GEMM call counts toward the prompt that runs it
    try:
        register_routes()
    except Exception as exc:  # e.g. ComfyUI used as a library, without a PromptServer
        log.warning("Ideogram4 INT8: GEMM status routes not registered (%s: %s)", type(exc).__name__, exc)
    apply_timing_env()
