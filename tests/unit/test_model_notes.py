"""Model notes (kernels/model_notes.py) through the registry that holds them: set, unchanged, cleared per model."""

from __future__ import annotations

from comfyui_ideogram4_int8.kernels.registry import GemmRegistry


def test_a_models_notes_go_with_its_layers_and_no_other():
    reg = GemmRegistry()
    reg.declare("conditional/layers.0.attention.o", "triton-int8", "", 64, 64)
    assert reg.set_model_note("conditional", "streaming", "3 blocks streamed")
    assert not reg.set_model_note("conditional", "streaming", "3 blocks streamed")  # unchanged
    assert reg.set_model_note("unconditional", "device", "cuda:1")
    both = {"conditional": {"streaming": "3 blocks streamed"}, "unconditional": {"device": "cuda:1"}}
    assert reg.model_notes() == both
    reg.model_notes("conditional")["streaming"] = "changed by a reader"  # a copy: the store keeps its note
    assert reg.model_notes("conditional") == {"streaming": "3 blocks streamed"}
    reg.clear("conditional")
    assert reg.layers() == [] and reg.model_notes() == {"unconditional": {"device": "cuda:1"}}
    assert reg.set_model_note("unconditional", "device", None) and reg.model_notes() == {}
    reg.set_model_note("conditional", "bypass", "1 of 1 quantized linears did not run through the pack's op")
    reg.clear()
    assert reg.model_notes() == {}
