"""``python -m comfyui_ideogram4_int8.bench.comfy``: the ComfyUI end-to-end benchmark (``cli.py`` says what it runs)."""

from .cli import run

if __name__ == "__main__":
    run()
