"""Model notes (kernels/model_notes.py): set, unchanged, read as copies, cleared per model, apart from the registry."""

from __future__ import annotations

import threading

from comfyui_ideogram4_int8.kernels import REGISTRY, model_notes
from comfyui_ideogram4_int8.kernels.model_notes import ModelNotes


def test_a_models_notes_change_and_clear_per_model():
    store = ModelNotes()
    assert store.set("conditional", "streaming", "3 blocks streamed")
    assert not store.set("conditional", "streaming", "3 blocks streamed")  # unchanged
    assert store.set("unconditional", "device", "cuda:1")
    both = {"conditional": {"streaming": "3 blocks streamed"}, "unconditional": {"device": "cuda:1"}}
    assert store.of() == both
    store.of("conditional")["streaming"] = "changed by a reader"  # a copy: the store keeps its note
    assert store.of("conditional") == {"streaming": "3 blocks streamed"}
    store.clear("conditional")
    assert store.of() == {"unconditional": {"device": "cuda:1"}} and store.of("conditional") == {}
    assert store.set("unconditional", "device", None) and store.of() == {}
    assert not store.set("unconditional", "device", None)  # nothing to clear
    store.set("conditional", "bypass", "1 of 1 quantized linears did not run through the pack's op")
    store.clear()
    assert store.of() == {}


def test_the_process_store_is_apart_from_the_registry():
    label = "notes-apart"
    REGISTRY.declare(f"{label}/layers.0.attention.o", "triton-int8", "", 64, 64)
    try:
        assert model_notes.set_note(label, "device", "cuda:1")
        assert not model_notes.set_note(label, "device", "cuda:1")
        REGISTRY.clear(label)  # the GEMM records go, the notes stay: whoever drops a model clears both
        assert REGISTRY.layers(label) == [] and model_notes.notes(label) == {"device": "cuda:1"}
        assert model_notes.notes()[label] == {"device": "cuda:1"}
        model_notes.clear(label)
        assert model_notes.notes(label) == {} and label not in model_notes.notes()
    finally:
        REGISTRY.clear(label)
        model_notes.clear(label)


def test_forgetting_a_model_drops_its_records_and_its_notes_only():
    label, other = "notes-forget", "notes-kept"
    for name in (label, other):
        REGISTRY.declare(f"{name}/layers.0.attention.o", "triton-int8", "", 64, 64)
        model_notes.set_note(name, "device", "cuda:0")
    try:
        model_notes.forget(label)
        assert REGISTRY.layers(label) == [] and model_notes.notes(label) == {}
        assert len(REGISTRY.layers(other)) == 1 and model_notes.notes(other) == {"device": "cuda:0"}
    finally:
        model_notes.forget(label)
        model_notes.forget(other)


def test_writers_on_several_threads_keep_every_note():
    store = ModelNotes()

    def write(i):
        for k in range(50):
            store.set(f"model{i}", f"kind{k}", f"message {i}.{k}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {m: len(n) for m, n in store.of().items()} == {f"model{i}": 50 for i in range(4)}
