"""The ComfyUI benchmark's earlier module path: ``python -m comfyui_ideogram4_int8.bench.comfy_e2e ...`` runs
``python -m comfyui_ideogram4_int8.bench.comfy ...`` (bench/comfy/), so commands written with it keep working."""

from .comfy.cli import run

if __name__ == "__main__":
    run()
