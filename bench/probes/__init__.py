"""Probes: one-off experiments and diagnostics behind a design decision or a number in docs/ (each runs as
``python -m comfyui_ideogram4_int8.bench.probes.<name>``), apart from the product benchmarks in bench/."""
