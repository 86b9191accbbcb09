"""The pack inside ComfyUI. With the root ``__init__``, the only package that imports ComfyUI.

What goes where: a module stays here when it is what a user meets in ComfyUI: a node module (one that exports
``NODES``, listed in ``extension.NODE_MODULES``), what the nodes share (``widgets``, ``panel``), the extension
that registers them, and the GEMM-path panel's server side (``status_nodes``, its report ``status_report`` and
``status.schema.json``). A module goes to ``runtime/`` when it changes how ComfyUI builds, loads or runs a MODEL
(the custom ops, the swapped blocks, the ModelPatcher and its streaming, CUDA graphs, attention, the coverage
check) and defines no node. Imports point one way: node modules import ``runtime``, ``runtime`` never imports a
node module.
"""
