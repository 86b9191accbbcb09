"""What the status-report tests share (tests/unit/test_status*.py, tests/cuda/test_status_gpu.py): a clean registry
around each test, the schema check, and a CPU run of real models from a synthetic checkpoint."""

from __future__ import annotations

import jsonschema
import panel_model
from comfyui_ideogram4_int8.kernels import REGISTRY, model_notes, settings
from comfyui_ideogram4_int8.kernels.path_choice import ENV_PATH
from comfyui_ideogram4_int8.nodes import status_report as status


def clean_registry_around(setting):
    """A test module's autouse fixture: no forced path, no timing, an empty registry and no published nodes, before
    and after the test."""
    setting(ENV_PATH, None)
    setting(settings.GEMM_TIMING, None)
    model_notes.forget()
    REGISTRY.enable_timing(False)
    status.forget_nodes()
    yield
    status.forget_nodes()
    model_notes.forget()
    REGISTRY.enable_timing(False)
    status.switch_timing(False, None)


def validate(report: dict) -> None:
    jsonschema.validate(report, status.load_schema(), cls=jsonschema.Draft202012Validator)


def load_and_run(tmp_path, gen, **kw):
    """Loader + sampler without ComfyUI (CPU, well under a second): {label: {module: panel_model.Linear}}."""
    return panel_model.load_and_run(tmp_path, gen.initial_seed(), **kw)
