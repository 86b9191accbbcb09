"""The GEMM-path status report: which path every W8A8 linear really ran, as JSON for the panel.

ComfyUI-free (torch, the kernels' registry and model notes only: tests build it without ComfyUI);
``status_nodes.py`` serves it at ``GET /ideogram4_int8/status`` and pushes a compact copy over the websocket after
each load and sampler run. The report's shape is ``status.schema.json`` (shipped next to this file);
``SCHEMA_VERSION`` changes whenever a field changes meaning or goes away.

What the report never contains: file-system paths and tokens. Every free-text string taken
from the registry (model labels, layer names, reasons, config sources) goes through
:func:`scrub_text`, which cuts an absolute path down to its last component and masks
token-like strings, so a loader that once writes a checkpoint path into a reason cannot leak
the user's directory layout through the panel.

Timing (off by default): when ``REGISTRY.timing_enabled`` is on, every CUDA GEMM is bracketed
by CUDA events. The *sampler* owns the run boundary: it calls ``REGISTRY.begin_run()`` right
before sampling and ``REGISTRY.end_run()`` right after (then ``publish("run")``); the report
gives the per-path GEMM milliseconds of that last run and each path's share of its wall time,
which is also each path's share of an average step. CPU GEMMs are not timed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import re
import time
from collections.abc import Mapping

from ..kernels import cpu_gemm, model_notes, settings
from ..kernels.backends import no_cuda_reason
from ..kernels.env import environment_report, interpreter_mode
from ..kernels.path_choice import ENV_PATH, labels_here
from ..kernels.registry import PATH_CUBLAS, PATH_DEQUANT, PATH_TRITON, PATHS, REGISTRY
from ..kernels.tuning import EPILOGUE_PAIR, PICKER

BYPASS = "bypass"  # the registry's model note of op_coverage (a forward that routed around the pack's op)

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SCHEMA_PATH = pathlib.Path(__file__).with_name("status.schema.json")

ROUTE = "/ideogram4_int8/status"
TIMING_ROUTE = "/ideogram4_int8/timing"
EVENT = "ideogram4_int8.status"

QUERY_PARAMS = ("model", "layers")
MAX_LABEL_LEN = 200

ROLES = ("conditional", "unconditional", "other")

# The official negative pass is image-only (DESIGN 4: DualModelGuider's negative unconnected, the pack's sampler):
# an unconditional model's text projection is loaded but never runs there. Once the model ran, such a layer is
# reported as idle by design, with this as its reason, not as a layer still to run with its path's reason.
IMAGE_ONLY_LAYERS = ("llm_cond_proj",)
IMAGE_ONLY_WHY = "not run by design: the unconditional pass is image-only (no text tokens to project)"


# -- errors ---------------------------------------------------------------------------------------


class StatusQueryError(ValueError):
    """A bad query parameter (HTTP 400) or a model that is not loaded (HTTP 404).

    ``as_dict()`` is the JSON error body: ``{"error": message, "parameter": name}``.
    """

    def __init__(self, parameter: str, message: str, status: int = 400, **extra) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.status = status
        self.extra = extra

    def as_dict(self) -> dict:
        return {"error": str(self), "parameter": self.parameter, **self.extra}


# -- scrubbing ------------------------------------------------------------------------------------

# An absolute (or home-relative) path: POSIX "/a/b", "~/a", Windows "C:\\a\\b" or "\\\\server\\share".
# It must not start inside a word, so "N/K" or "conditional/layers.0" are left alone.
# Inner folders may contain spaces ("/home/me/my models/x.safetensors"); the last component ends at
# whitespace. When unsure, this cuts too much rather than too little.
_PATH_RE = re.compile(
    r"(?<![\w.\-])(?:~|[A-Za-z]:)?(?:[/\\]{1,2}[^/\\'\"\n;,()]*?(?=[/\\]))*[/\\]{1,2}[^\s/\\'\"(),;]+[/\\]?"
)
_TOKEN_RES = (
    re.compile(r"\bhf_[A-Za-z0-9]{8,}"),
    re.compile(r"(?i)\b(token|api[_-]?key|authorization|password|secret)(\s*[=:]\s*)(\S+)"),
    re.compile(r"(?i)\b(bearer)(\s+)(\S+)"),
)


def _basename(match: re.Match) -> str:
    parts = [p for p in re.split(r"[/\\]", match.group(0)) if p and p != "~" and not re.fullmatch(r"[A-Za-z]:", p)]
    return parts[-1] if parts else "<path>"


def scrub_text(text: str | None) -> str | None:
    """Cut absolute paths to their basename and mask token-like strings (``hf_…``, ``token=…``)."""
    if text is None:
        return None
    text = str(text)
    text = _TOKEN_RES[0].sub("hf_***", text)
    text = _TOKEN_RES[1].sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    text = _TOKEN_RES[2].sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    return _PATH_RE.sub(_basename, text)


# -- query parameters -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StatusParams:
    model: str | None = None
    include_layers: bool = True


def _values(query, key) -> list[str]:
    if hasattr(query, "getall"):  # aiohttp / multidict: repeated keys are kept
        return [str(v) for v in query.getall(key)]
    value = query[key]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def validate_status_params(query: Mapping | None) -> StatusParams:
    """Parse the route's query string; raise :class:`StatusQueryError` (400) naming the parameter.

    Parameters: ``model`` (a model label, e.g. ``conditional``; default: every model) and
    ``layers`` (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``; default ``1``:
    include the per-layer table). Unknown or repeated parameters are errors, so a typo never
    silently returns the default report.
    """
    if not query:
        return StatusParams()
    unknown = sorted(str(k) for k in query.keys() if k not in QUERY_PARAMS)
    if unknown:
        name = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:40] + "..."
        raise StatusQueryError(name, f"unknown query parameter {name!r}; expected one of {', '.join(QUERY_PARAMS)}")
    model = None
    include_layers = True
    if "model" in query:
        vals = _values(query, "model")
        if len(vals) != 1:
            raise StatusQueryError("model", f"'model' given {len(vals)} times; give it once")
        model = vals[0]
        if not model.strip():
            raise StatusQueryError("model", "'model' is empty; leave it out for every model")
        if len(model) > MAX_LABEL_LEN or any(ord(c) < 32 for c in model):
            raise StatusQueryError(
                "model", f"'model' must be a model label of at most {MAX_LABEL_LEN} printable characters"
            )
    if "layers" in query:
        vals = _values(query, "layers")
        if len(vals) != 1:
            raise StatusQueryError("layers", f"'layers' given {len(vals)} times; give it once")
        raw = vals[0].strip().lower()
        if raw in settings.ON:
            include_layers = True
        elif raw in settings.OFF:
            include_layers = False
        else:
            shown = vals[0] if len(vals[0]) <= 40 else vals[0][:40] + "..."
            raise StatusQueryError("layers", f"'layers' must be 1 or 0 (true/false, yes/no, on/off); got {shown!r}")
    return StatusParams(model=model, include_layers=include_layers)


# -- timing switch --------------------------------------------------------------------------------

_timing_state = {"switched_by": None}


def switch_timing(enabled: bool, by: str) -> None:
    """Turn per-GEMM CUDA-event timing on/off and remember who did (``env``, ``setting``, ``api``)."""
    REGISTRY.enable_timing(bool(enabled))
    _timing_state["switched_by"] = by


# -- the report -----------------------------------------------------------------------------------


def role_of(label: str) -> str:
    low = label.lower()
    if low.startswith("unconditional"):
        return "unconditional"
    if low.startswith("conditional"):
        return "conditional"
    return "other"


def _natural_key(text: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


# Ideogram 4's linears in forward order: top-level ones before the blocks (image and text projections, timestep
# MLP, AdaLN input), and inside a block; a name not listed sorts after the listed ones, by name.
_TOP_ORDER = ("input_proj", "llm_cond_proj", "t_embedding.", "adaln_proj")
_BLOCK_ORDER = (
    "adaln_modulation",
    "attention.qkv",
    "attention.o",
    "feed_forward.w1",
    "feed_forward.w3",
    "feed_forward.w2",
)


def _rank(name: str, order: tuple[str, ...]) -> int:
    return next((i for i, prefix in enumerate(order) if name.startswith(prefix)), len(order))


def _layer_order(layer: str):
    # Forward order whatever order the registry saw them in: input projections and embeddings,
    # then the blocks by index (layers.2 before layers.10), then the final layer.
    if layer.startswith(("layers.", "blocks.")):
        _, index, rest = (layer.split(".", 2) + ["", ""])[:3]
        return (1, int(index) if index.isdigit() else -1, _rank(rest, _BLOCK_ORDER), _natural_key(layer))
    if layer.startswith("final"):
        return (2, 0, 0, _natural_key(layer))
    return (0, 0, _rank(layer, _TOP_ORDER), _natural_key(layer))


def _model_order(label: str):
    return (ROLES.index(role_of(label)), _natural_key(label))


def _environment() -> dict:
    env = environment_report()
    forced, raw = settings.gemm_path(), settings.current().raw.get(ENV_PATH)
    wrong = ENV_PATH in settings.problems()
    env["triton_interpreter"] = interpreter_mode()
    env["forced_path"] = {
        "variable": ENV_PATH,
        "value": forced or (scrub_text(raw[:64]) if wrong else None),
        "valid": True if forced else False if wrong else None,
    }
    return env


def _idle_by_design(label: str, rec, model_ran: bool) -> bool:
    """``rec`` did not run in a model whose other layers did, and its model's passes never run it (IMAGE_ONLY_LAYERS
    of an unconditional model)."""
    return model_ran and not rec.calls and role_of(label) == "unconditional" and rec.layer in IMAGE_ONLY_LAYERS


def _layer_entry(rec, idle: bool = False) -> dict:
    return {
        "layer": scrub_text(rec.layer),
        "path": rec.path,
        "reason": IMAGE_ONLY_WHY if idle else scrub_text(rec.reason) or "",
        "N": rec.n,
        "K": rec.k,
        "M_last": rec.m_last,
        "calls": rec.calls,
        "calls_last_run": rec.run_calls,
        "last_run": scrub_text(rec.run),
        "dtype": rec.dtype,
        "config": scrub_text(rec.config),
        "config_source": scrub_text(rec.config_source),
        "fusion": scrub_text(rec.fusion),
    }


def _shapes(records, picks) -> list[dict]:
    by_shape: dict[tuple[int, int], dict] = {}
    for rec in records:
        entry = by_shape.setdefault(
            (rec.n, rec.k), {"N": rec.n, "K": rec.k, "layers": 0, "paths": {p: 0 for p in PATHS}, "autotune": []}
        )
        entry["layers"] += 1
        entry["paths"][rec.path] += 1
    for pick in picks:
        pair = pick.get("epilogue") == EPILOGUE_PAIR  # keyed N = 2F: listed under each projection's [F, K]
        entry = by_shape.get((pick["N"] // 2 if pair else pick["N"], pick["K"]))
        if entry is not None:
            entry["autotune"].append(
                {
                    "m_bucket": pick["m_bucket"],
                    "arch": pick["arch"],
                    "gpu": pick["gpu"],
                    "config": scrub_text(pick["config"] + (" (w1|w3 pair)" if pair else "")),
                    "source": scrub_text(pick["source"]),
                }
            )
    for entry in by_shape.values():
        entry["autotune"].sort(key=lambda p: (p["arch"], p["gpu"], p["m_bucket"]))
    return [by_shape[key] for key in sorted(by_shape)]


def _reasons(records, idle=frozenset()) -> list[dict]:
    """Layers per (path, reason), most first: the why-not of the layer table, also where the table is left out
    (the websocket push), so a badge can say why without fetching it. Layers ``idle`` by design are left out: their
    path did not run, so it has no why-not."""
    groups: dict[tuple[str, str], int] = {}
    for rec in records:
        if rec.site in idle:
            continue
        key = (rec.path, scrub_text(rec.reason) or "")
        groups[key] = groups.get(key, 0) + 1
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1], PATHS.index(kv[0][0]), kv[0][1]))
    return [{"path": path, "reason": reason, "layers": n} for (path, reason), n in ordered]


def _model_entry(label: str, records, picks, include_layers: bool, notes: dict | None = None) -> dict:
    records = sorted(records, key=lambda r: _layer_order(r.layer))
    counts = {p: 0 for p in PATHS}
    counts_run = {p: 0 for p in PATHS}
    for rec in records:
        counts[rec.path] += 1
        if rec.calls:
            counts_run[rec.path] += 1
    ran = [r for r in records if r.calls]
    last = max(ran, key=lambda r: r.last_used).run if ran else None
    idle = {r.site for r in records if _idle_by_design(label, r, bool(ran))}
    return {
        "label": scrub_text(label),
        "role": role_of(label),
        "layers_total": len(records),
        "layers_run": sum(1 for r in records if r.calls),
        "calls": sum(r.calls for r in records),
        "last_run": scrub_text(last),
        "calls_last_run": sum(r.run_calls for r in ran if r.run == last),
        "counts": counts,
        "counts_run": counts_run,
        "shapes": _shapes(records, picks),
        "layers": [_layer_entry(r, r.site in idle) for r in records] if include_layers else None,
        "reasons": _reasons(records, idle),
        # layers its passes never run (they count in layers_total, not in layers_run): layer -> why
        "idle": {scrub_text(r.layer): IMAGE_ONLY_WHY for r in records if r.site in idle},
        "bypass": scrub_text((notes or {}).get(BYPASS)),
        # what else the model's owner said about it (low-VRAM streaming, its device), kind -> text
        "notes": {str(k): scrub_text(v) for k, v in sorted((notes or {}).items()) if k != BYPASS and v},
    }


def _timing(registry) -> dict:
    last = registry.last_run()
    note = None
    last_run = None
    if last is not None:
        wall = last.get("wall_ms")
        per_path = {}
        for path in PATHS:
            ms = float(last["gemm_ms_per_path"].get(path, 0.0))
            per_path[path] = {"ms": ms, "share": (ms / wall) if wall else None}
        gemm = sum(v["ms"] for v in per_path.values())
        last_run = {
            "wall_ms": wall,
            "gemm_ms": gemm,
            "gemm_share": (gemm / wall) if wall else None,
            "per_path": per_path,
        }
    elif registry.timing_enabled:
        note = (
            "timing is on, but no timed run has finished yet: GEMM time is measured with CUDA events "
            "between the sampler's begin_run() and end_run(); GEMMs on the CPU are not timed"
        )
    return {
        "enabled": bool(registry.timing_enabled),
        "switched_by": _timing_state["switched_by"],
        "env_variable": settings.GEMM_TIMING,
        "last_run": last_run,
        "note": note,
    }


def _cpu_paths() -> str:
    """What the quantized linears run on this CPU, as far as decided (the report never starts a measurement)."""
    answer = cpu_gemm.decided()
    if answer is None:
        return (
            "quantized linears run torch._int_mm (cublas-int8) where this CPU measures it fast, else a dequantized "
            "float32 matmul (dequant-bf16): decided at the first W8A8 call"
        )
    dtype = str(answer.float_dtype).replace("torch.", "")
    if answer.int_mm_fast:
        return f"quantized linears run torch._int_mm on the CPU (cublas-int8; {answer.summary()})"
    return (
        f"quantized linears run a dequantized {dtype} matmul (dequant-bf16), faster than torch._int_mm on this CPU "
        f"({answer.summary()}); {ENV_PATH}=cublas-int8 forces torch._int_mm"
    )


def _path_labels() -> dict:
    """The report's ``path_labels``: the device, what each path runs there, the path the pack prefers there (the
    CPU's measured choice) and the reason every quantized linear there shares (off CUDA: the fused kernels need a
    GPU), which the status message gives once so the panel need not repeat it per layer and note."""
    device, labels = labels_here()
    answer = cpu_gemm.decided()
    if device == "cuda":
        preferred = PATH_TRITON
    else:
        preferred = PATH_DEQUANT if answer is not None and not answer.int_mm_fast else PATH_CUBLAS
    shared = None if device == "cuda" else no_cuda_reason(device)
    return {"device": device, "labels": labels, "preferred": preferred, "device_reason": shared}


def _status(env: dict, models: list[dict]) -> dict:
    notes = []
    if not env["cuda_available"]:
        notes.append(
            f"No CUDA GPU is visible to torch {env['torch']}: {_cpu_paths()}. The fused Triton INT8 kernel needs "
            "an NVIDIA GPU (sm_80 or newer)."
        )
    forced = env["forced_path"]
    if forced["valid"]:
        notes.append(f"{ENV_PATH}={forced['value']} forces that path wherever it can run.")
    notes += [scrub_text(problem) for problem in settings.problems().values()]  # switches not understood
    notes += [f"{m['label']}: {m['bypass']}" for m in models if m["bypass"]]
    if not models:
        code = "no_models_yet"
        message = (
            "No Ideogram 4 INT8 model has run yet. Load one with the pack's loader and run the sampler; "
            "this panel then shows the GEMM path every linear really took."
        )
    elif not env["cuda_available"]:
        code = "no_cuda"
        message = notes.pop(0)
    else:
        code = "ok"
        message = f"{len(models)} model(s) reported."
    return {"code": code, "message": message, "notes": notes}


# -- which node ran which models in which run (the node badges) --------------------------------------------------

MAX_NODE_RUNS = 64
_node_runs: dict[str, dict] = {}


def note_node(
    node_id: str | None,
    node_type: str | None,
    event: str,
    models: list[str] | None,
    prompt_id: str | None,
    source: Mapping | None = None,
) -> None:
    """Remember the last event of a node (a loader's "load", a sampler's "run"): its models, the run (ComfyUI prompt
    id) and, for a loader, the files it loaded (``source``: input name -> the name the user picked). The report lists
    them under ``nodes``, so a badge belongs to a node of that type that ran in that run with those inputs, not to
    whatever node has the same id after a reload."""
    if node_id is None:
        return
    key = str(node_id)
    _node_runs.pop(key, None)
    _node_runs[key] = {
        "node_type": scrub_text(node_type) if node_type else None,
        "event": str(event),
        "prompt_id": scrub_text(prompt_id) if prompt_id else None,
        "models": None if models is None else [scrub_text(str(m)) for m in models],
        "source": {str(k): scrub_text(str(v)) for k, v in source.items()} if source else None,
        "at": time.time(),
    }
    while len(_node_runs) > MAX_NODE_RUNS:
        _node_runs.pop(next(iter(_node_runs)))


def forget_nodes() -> None:
    _node_runs.clear()


def _last_prompt_id(records) -> str | None:
    """The latest run the pack took part in: a node's event or a GEMM call, whichever came last."""
    seen = [(e["at"], e["prompt_id"]) for e in _node_runs.values() if e["prompt_id"]]
    seen += [(r.last_used, r.run) for r in records if r.calls and r.run]
    return scrub_text(max(seen)[1]) if seen else None


_pack = {"version": "unknown"}  # the pack's __version__, passed in by the entry point (set_pack_version)


def set_pack_version(version: str) -> None:
    """The version the report names (the root package's ``__version__``; this module never imports up)."""
    _pack["version"] = str(version)


def status_report(
    model: str | None = None,
    include_layers: bool = True,
    registry=None,
    picker=None,
) -> dict:
    """The panel's JSON (schema: ``status.schema.json``).

    Args:
        model: only this model label (e.g. ``"conditional"``); None for every model.
        include_layers: include the per-layer table (the websocket push leaves it out).
        registry, picker: the GEMM registry and autotune picker (default: the process-wide ones); each model's
            notes come from ``model_notes``.

    Raises:
        StatusQueryError: ``model`` is not a loaded model (status 404; lists the known labels).
    """
    registry = REGISTRY if registry is None else registry
    picker = PICKER if picker is None else picker
    labels = sorted(registry.models(), key=_model_order)
    if model is not None:
        if model not in labels:
            known = ", ".join(scrub_text(x) for x in labels) or "none yet"
            raise StatusQueryError(
                "model",
                f"no model labelled {scrub_text(model)[:MAX_LABEL_LEN]!r} has run; known: {known}",
                status=404,
                known=[scrub_text(x) for x in labels],
            )
        labels = [model]
    picks = picker.picks()
    models = [
        _model_entry(label, registry.layers(label), picks, include_layers, model_notes.notes(label)) for label in labels
    ]
    env = _environment()
    return {
        "schema_version": SCHEMA_VERSION,
        "pack_version": _pack["version"],
        "generated_at": time.time(),
        "status": _status(env, models),
        "environment": env,
        "paths": list(PATHS),
        "path_labels": _path_labels(),
        "models": models,
        "timing": _timing(registry),
        "last_prompt_id": _last_prompt_id(registry.layers()),
        "nodes": {k: {n: v for n, v in e.items() if n != "at"} for k, e in _node_runs.items()},
    }


def status_response(query: Mapping | None) -> tuple[int, dict]:
    """(HTTP status, JSON body) for ``GET /ideogram4_int8/status?…``; never raises.

    200 with the report; 400 for a bad parameter and 404 for a model that has not run, each with
    ``{"error", "parameter"}``; 500 with a short message (no traceback) if building the report fails.
    """
    try:
        params = validate_status_params(query)
        return 200, status_report(params.model, params.include_layers)
    except StatusQueryError as exc:
        return exc.status, exc.as_dict()
    except Exception as exc:  # the route must answer, never leak a traceback
        _log.exception("Ideogram4 INT8: building the GEMM status report failed")
        return 500, {"error": f"building the GEMM status report failed ({type(exc).__name__}); see the ComfyUI log"}


def validate_timing_body(body) -> bool:
    """``POST /ideogram4_int8/timing`` body ``{"enabled": true|false}`` -> the flag, or StatusQueryError (400)."""
    if not isinstance(body, dict):
        raise StatusQueryError("enabled", 'the body must be a JSON object {"enabled": true} or {"enabled": false}')
    unknown = sorted(k for k in body if k != "enabled")
    if unknown:
        raise StatusQueryError(unknown[0], f"unknown field {str(unknown[0])[:40]!r}; the only field is 'enabled'")
    if not isinstance(body.get("enabled"), bool):
        raise StatusQueryError("enabled", "'enabled' must be true or false")
    return body["enabled"]


def load_schema() -> dict:
    """The report's JSON Schema (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text())


__all__ = [
    "set_pack_version",
    "EVENT",
    "ROUTE",
    "TIMING_ROUTE",
    "SCHEMA_VERSION",
    "SCHEMA_PATH",
    "StatusParams",
    "StatusQueryError",
    "load_schema",
    "role_of",
    "scrub_text",
    "status_report",
    "status_response",
    "validate_timing_body",
    "switch_timing",
    "validate_status_params",
]
