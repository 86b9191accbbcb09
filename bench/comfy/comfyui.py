"""ComfyUI in this process: imported as a library (the in-process run) or set up as its server sets itself up (each
``--vram`` child: comfy-aimdo's DynamicVRAM, async offload, the executor's clean-up after each node); its version."""

from __future__ import annotations

import pathlib
import sys

import torch

from .device import GIB


def import_comfyui(root: str):
    root = str(pathlib.Path(root).resolve())
    sys.path.insert(0, root)
    argv, sys.argv = sys.argv, [sys.argv[0]]
    try:
        from comfy.cli_args import args  # ComfyUI's defaults (it parses the command line only under main.py)

        args.cpu = not torch.cuda.is_available()
        import comfy.model_management  # noqa: F401
    finally:
        sys.argv = argv


def setup_comfyui(root: str, server: bool, options: dict | None = None) -> str:
    """Import ComfyUI as its server does, with ``options`` (ComfyUI's command-line options by their ``args`` name, e.g.
    ``use_ck_attention``) set before its modules read them; returns what DynamicVRAM did ("enabled", or why not)."""
    root = str(pathlib.Path(root).resolve())
    sys.path.insert(0, root)
    argv, sys.argv = sys.argv, [sys.argv[0]]
    try:
        from comfy.cli_args import args, enables_dynamic_vram

        for name, value in (options or {}).items():
            setattr(args, name, value)

        state = "off (--setup plain)"
        control = None
        if server and enables_dynamic_vram():
            try:
                import comfy_aimdo.control as control

                try:
                    control.init(simple_vram_headroom=None, nvml_pressure=True)
                except TypeError:
                    control.init()
            except Exception as exc:  # noqa: BLE001
                state, control = f"comfy-aimdo did not load: {type(exc).__name__}: {exc}"[:200], None
        import comfy.memory_management
        import comfy.model_management as mm
        import comfy.model_patcher

        if server and control is not None:
            if mm.torch_version_numeric < (2, 8):
                state = "off: torch < 2.8"
            else:
                try:
                    devices = mm.get_all_torch_devices()
                    ok = control.init_devices((d.index, int(args.vram_headroom * GIB)) for d in devices)
                except TypeError:
                    ok = control.init_devices(d.index for d in mm.get_all_torch_devices())
                if ok:
                    comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
                    comfy.memory_management.aimdo_enabled = True
                    state = "enabled"
                else:
                    state = "off: comfy_aimdo.control.init_devices returned False (as the server would fall back)"
        state += f"; async offload streams {mm.NUM_STREAMS}"
        return state
    finally:
        sys.argv = argv


def server_cleanup() -> None:
    """What ComfyUI's executor does after each node when DynamicVRAM is on (execution.py)."""
    import comfy.memory_management
    import comfy.model_management

    if comfy.memory_management.aimdo_enabled:
        import comfy_aimdo.model_vbar

        comfy.model_management.reset_cast_buffers()
        comfy_aimdo.model_vbar.vbars_reset_watermark_limits()


def comfyui_version(root: str) -> str:
    try:
        text = (pathlib.Path(root) / "comfyui_version.py").read_text()
        return text.split("=")[-1].strip().strip("\"'")
    except OSError:
        return "?"
