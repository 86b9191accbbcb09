"""Checks of the pack's ComfyUI nodes inside a real ComfyUI's Python (in-process, --cpu).

Usage: <comfy python> comfy_nodes_script.py COMFYUI_DIR PACK_PARENT_DIR WORK_DIR CHECK SEED
Prints one JSON line with the measurements of CHECK; the tests in tests/comfyui/ assert on them.
Every check writes fresh synthetic weights (seeded by SEED) into WORK_DIR/models/diffusion_models.
The checks live in comfy_checks/, one module per feature; comfy_checks/common.py reads this command line and sets
ComfyUI up before any check module imports it.
"""

import json
import traceback

from comfy_checks import (
    block_norms,
    coverage,
    cuda_graphs,
    devices,
    gate_up,
    host_copies,
    loader,
    lora,
    parity,
    parking,
    pin_ahead,
    rope,
    sampler,
    streaming,
    torch_compile,
    upload,
)
from comfy_checks.common import check

CHECKS = {
    "rope": rope.check_rope,
    "rope_demotion": rope.check_rope_demotion,
    "parity": parity.check_parity,
    "sampler": sampler.check_sampler,
    "protected_fp8": parity.check_protected_fp8,
    "interrupt": sampler.check_interrupt,
    "lora": lora.check_lora,
    "smooth": lora.check_smooth,
    "offload": loader.check_offload,
    "patch": loader.check_patch,
    "bad_inputs": loader.check_bad_inputs,
    "hooks": loader.check_hooks,
    "gate_up": gate_up.check_gate_up,
    "gate_up_lora": gate_up.check_gate_up_lora,
    "coverage": coverage.check_coverage,
    "coverage_replay": coverage.check_coverage_replay,
    "block_norms": block_norms.check_block_norms,
    "block_norm_handoff": block_norms.check_block_norm_handoff,
    "resident_conds": devices.check_resident_conds,
    "step_profile": sampler.check_step_profile,
    "compile": torch_compile.check_compile,
    "streaming": streaming.check_streaming,
    "upload": upload.check_upload,
    "host_copies": host_copies.check_host_copies,
    "file_pages": host_copies.check_file_pages,
    "pin_ahead": pin_ahead.check_pin_ahead,
    "parking": parking.check_parking,
    "branch_device": devices.check_branch_device,
    "cuda_graphs": cuda_graphs.check_cuda_graphs,
}

try:
    result = CHECKS[check]()
except Exception:  # noqa: BLE001
    result = {"__error__": traceback.format_exc()}
print("RESULT " + json.dumps(result, default=str))
