"""Thin ComfyUI V3 nodes. The only package (with the root ``__init__``) that imports ComfyUI."""
