"""The pack's attention override for its ComfyUI MODELs (nodes/runtime/attention_override.py, no ComfyUI import)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attention_fakes import FakeCandidate, fake_timer
from comfyui_ideogram4_int8.kernels import attention_choice, model_notes
from comfyui_ideogram4_int8.nodes.runtime import attention_override as A
from kernel_checks import rel_err


def _qkv(gen, b=1, h=2, n=40, d=64, dtype=torch.float32, device="cpu"):
    return [torch.randn(b, h, n, d, generator=gen).to(device, dtype) for _ in range(3)]


def test_everything_it_does_not_serve_goes_to_comfyuis_function_unchanged(gen):
    calls = []

    def comfy_attention(q, k, v, heads, **kw):
        calls.append((q, heads, kw))
        return "comfyui"

    q, k, v = _qkv(gen)
    mask = torch.zeros(1, 1, 40, 40)
    cases = [
        dict(),  # CPU tensors
        dict(mask=mask),
        dict(skip_reshape=False),
    ]
    override = A.PackAttention("conditional")
    for extra in cases:
        kw = dict(skip_reshape=True, transformer_options={"x": 1}) | extra
        assert override(comfy_attention, q, k, v, 2, **kw) == "comfyui"
        assert calls[-1][0] is q and calls[-1][1] == 2 and calls[-1][2]["transformer_options"] == {"x": 1}
        assert calls[-1][2]["mask"] is extra.get("mask")
    assert len(calls) == len(cases)
    assert sum(override.runs.values()) == 0  # it served none of them


def test_install_respects_the_switch_and_an_earlier_override(setting):
    opts: dict = {}
    said = A.install(opts, label="conditional")
    if A.PRIORITY is None:
        assert "cannot order" in said and opts == {}
        return
    ours = opts["transformer_options"][A.KEY]
    assert isinstance(ours, A.PackAttention) and ours.label == "conditional" and "cuDNN first" in said
    again = {"transformer_options": {A.KEY: ours}}  # the pack's own, e.g. on a clone: replaced with this label's
    A.install(again, label="unconditional")
    assert again["transformer_options"][A.KEY].label == "unconditional"
    theirs = {"transformer_options": {A.KEY: lambda *a, **k: None}}
    assert "kept" in A.install(theirs) and not isinstance(theirs["transformer_options"][A.KEY], A.PackAttention)
    setting("IDEOGRAM4_INT8_ATTENTION", "comfyui")
    off: dict = {}
    assert "comfyui" in A.install(off) and off == {}


def test_the_summary_names_what_runs_on_the_models_device(setting):
    if A.PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    opts: dict = {}
    said = A.install(opts, torch.device("cpu"))
    assert said.startswith("attention: ComfyUI's own on the CPU") and "~2x" not in said
    assert isinstance(opts["transformer_options"][A.KEY], A.PackAttention)  # kept: it passes CPU tensors through
    cuda = A.install({}, torch.device("cuda", 0))
    # no 8-bit path on a machine without a CUDA GPU: SDPA, and why not each of the others
    assert "cuDNN first" in cuda and "int8: " in cuda and "fp8: " in cuda
    setting("IDEOGRAM4_INT8_ATTENTION", "int8")
    forced = A.install({}, torch.device("cuda", 0))
    assert "IDEOGRAM4_INT8_ATTENTION=int8 asked for, but" in forced and "needs a CUDA GPU" not in forced


@pytest.fixture
def served(monkeypatch, setting, tmp_path):
    """The override serving CPU tensors, through fake candidates ("sdpa", "int8") and a fake timer: int8 is faster
    and within the bound."""
    setting("IDEOGRAM4_INT8_CACHE_DIR", str(tmp_path))
    attention_choice.clear()
    fakes = {"sdpa": FakeCandidate("sdpa"), "int8": FakeCandidate("int8")}
    monkeypatch.setattr(A, "_serves", lambda q, k, v, mask, skip_reshape, kw: mask is None and skip_reshape)
    monkeypatch.setattr(A, "CANDIDATES", fakes)
    monkeypatch.setattr(attention_choice, "CANDIDATES", fakes)
    monkeypatch.setattr(attention_choice, "wall_timer", fake_timer(fakes, {"sdpa": 2.0, "int8": 1.0}))
    yield fakes
    attention_choice.clear()


def test_the_chosen_path_runs_is_counted_and_named_in_the_models_note(served, gen):
    override = A.PackAttention("attn-test")
    q, k, v = _qkv(gen, h=2, n=32, d=16)
    out = override(None, q, k, v, 2, skip_reshape=True)
    assert out.shape == (1, 32, 2 * 16)
    assert override.runs["int8"] == 1 and override.runs["sdpa"] == 0
    note = model_notes.notes("attn-test")["attention"]
    assert note.startswith("attention at L=32, 2 heads of 16: int8") and "1.000 ms" in note and "2.000 ms" in note
    override(None, q, k, v, 2, skip_reshape=True, skip_output_reshape=True)
    assert override.runs["int8"] == 2


def test_an_8bit_path_that_fails_on_a_real_call_gives_way_to_sdpa_for_good(served, gen):
    override = A.PackAttention("attn-fail")
    q, k, v = _qkv(gen, h=2, n=24, d=16)
    override(None, q, k, v, 2, skip_reshape=True)  # measured: int8 chosen
    served["int8"].fail = True
    out = override(None, q, k, v, 2, skip_reshape=True, skip_output_reshape=True)
    assert rel_err(out, F.scaled_dot_product_attention(q, k, v)) < 1e-6
    assert override.runs == {"sdpa": 1, "int8": 1}
    assert "int8 failed at L=24" in model_notes.notes("attn-fail")["attention"]
    calls = served["int8"].calls
    override(None, q, k, v, 2, skip_reshape=True)
    assert override.runs["sdpa"] == 2 and served["int8"].calls == calls  # not tried again
