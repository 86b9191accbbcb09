"""TEST-ONLY ComfyUI node pack for the GEMM-path panel's integration tests. Never shipped.

ComfyUI loads it only when a test points ``--base-directory`` at a folder whose ``custom_nodes``
links here (tests/test_status_comfyui.py). Until the pack's loader and sampler nodes exist, its one
node stands in for "load an Ideogram 4 INT8 model and sample": it writes a toy W8A8 checkpoint,
runs every linear through the real kernels (tests/synthetic_model.py), brackets the run with
``REGISTRY.begin_run()/end_run()`` and calls ``nodes.status_nodes.publish`` like the real nodes will.
Its id starts with ``Ideogram4Int8`` and names a sampler, so the panel gives it a badge.
"""

import importlib
import pathlib
import sys
import tempfile

_TESTS = pathlib.Path(__file__).resolve().parents[2]


def _pack():
    for name, module in list(sys.modules.items()):
        if name.endswith("ideogram4_int8") and hasattr(module, "comfy_entrypoint"):
            return name
    raise RuntimeError("the comfyui_ideogram4_int8 pack is not loaded in this ComfyUI")


class Ideogram4Int8PanelProbeSampler:
    CATEGORY = "testing/ideogram4_int8"
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "steps": ("INT", {"default": 2, "min": 1, "max": 20}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")  # run every time: each run must reach the registry

    def run(self, steps, seed, unique_id=None):
        if str(_TESTS) not in sys.path:
            sys.path.insert(0, str(_TESTS))
        import synthetic_model

        pack = _pack()
        registry = importlib.import_module(f"{pack}.kernels").REGISTRY
        status_nodes = importlib.import_module(f"{pack}.nodes.status_nodes")
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = synthetic_model.write_checkpoint(pathlib.Path(tmp) / "toy-w8a8.safetensors", seed=seed)
            status_nodes.publish("load", list(synthetic_model.BRANCHES), node_id=unique_id)
            registry.begin_run()
            try:
                synthetic_model.run_checkpoint(ckpt, steps=steps, seed=seed)
            finally:
                registry.end_run()
        status_nodes.publish("run", list(synthetic_model.BRANCHES), node_id=unique_id)
        return {}


NODE_CLASS_MAPPINGS = {"Ideogram4Int8PanelProbeSampler": Ideogram4Int8PanelProbeSampler}
NODE_DISPLAY_NAME_MAPPINGS = {"Ideogram4Int8PanelProbeSampler": "Ideogram4 INT8 panel probe (tests only)"}
