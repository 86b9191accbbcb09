"""The checks ``comfy_nodes_script.py`` runs inside ComfyUI's Python, one module per feature.

Importing the package first runs ``common``, which reads the script's command line and sets ComfyUI up in this
process, so that no check module imports torch or ComfyUI before that (whatever order its imports come in)."""

from comfy_checks import common  # noqa: F401
