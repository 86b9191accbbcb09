"""Bad input: a ValueError subclass naming the file, the key, expected vs found; nothing half-built."""

from __future__ import annotations

import dataclasses
import gc
import os
import pathlib
import weakref

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import errors as E
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.formats import encode_comfy_quant
from comfyui_ideogram4_int8.ideogram4.formats.source import Source
from comfyui_ideogram4_int8.ideogram4.safetensors_io import Header, save_tensors
from comfyui_ideogram4_int8.ideogram4.synthetic import is_nonlinear_or_top, write_comfy_int8, write_float, write_w8a8
from ideogram4_checks import TINY, assert_names, raw, tiny_weights

QKV = "layers.0.attention.qkv"
CHECKPOINT_ERRORS = (  # the reader's error types, each a subclass of E.CheckpointError
    E.NotSafetensorsError,
    E.MissingBranchError,
    E.MissingKeysError,
    E.TensorMismatchError,
    E.BaseMismatchError,
    E.UnsupportedFormatError,
    E.HubError,
)


@pytest.fixture
def w8a8_file(tmp_path, gen):
    return write_w8a8(tmp_path / "good.safetensors", tiny_weights(gen), TINY)


def tampered(path, out, change):
    """Copy of a checkpoint with ``change(tensors)`` applied (same metadata)."""
    tensors = raw(path)
    change(tensors)
    return save_tensors(out, tensors, Header(path).metadata)


def test_errors_are_value_errors():
    for cls in CHECKPOINT_ERRORS:
        assert issubclass(cls, E.CheckpointError) and issubclass(cls, ValueError)


def test_not_a_safetensors_file(tmp_path):
    junk = tmp_path / "model.safetensors"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(junk, "conditional")
    assert_names(ei.value, junk, "expected", "found 4096 bytes")
    pickle = tmp_path / "model.ckpt"
    pickle.write_bytes(b"\x80\x04\x95" + os.urandom(500))  # a pickle-protocol prefix
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(pickle, "conditional")
    assert_names(ei.value, pickle, "pickle")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(E.NotSafetensorsError, match="shorter than"):
        read_branch(empty, "conditional")
    with pytest.raises(E.NotSafetensorsError, match="not found") as ei:
        read_branch(tmp_path / "nope.safetensors", "conditional")
    assert_names(ei.value, "hf://")


def test_a_folder_is_called_a_folder_and_the_file_inside_is_named(tmp_path, w8a8_file):
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(tmp_path / "nowhere", "conditional")  # a path that does not exist stays "not found"
    assert "not found" in str(ei.value)
    folder = pathlib.Path(w8a8_file).parent
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(folder, "conditional")
    assert_names(
        ei.value,
        folder,
        "is a folder, not a file",
        "expected a .safetensors file",
        f"e.g. {folder / pathlib.Path(w8a8_file).name}",
    )
    assert "not found" not in str(ei.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(E.NotSafetensorsError, match="a folder with no .safetensors file"):
        read_branch(tmp_path / "empty", "conditional")


def test_truncated_file(tmp_path, w8a8_file):
    data = w8a8_file.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(cut, "conditional")
    assert_names(ei.value, cut, "truncated", f"{len(data) - 1000} bytes", "download the file again")
    inside_header = tmp_path / "cut_header.safetensors"  # the download stopped inside the JSON header
    inside_header.write_bytes(data[:40])
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(inside_header, "conditional")
    assert_names(ei.value, "truncated", "found 40 bytes", "download the file again")


@pytest.mark.parametrize(
    "content,says,fix",
    [
        (None, "the file is damaged", "download the file again"),  # random bytes
        (b'{"a":', "the file is damaged", "download the file again"),  # a header that is not JSON
        (
            b"version https://git-lfs.github.com/spec/v1\noid sha256:ab12\nsize 20400000000\n",
            "Git LFS pointer",
            "download the real file",
        ),
        (b"<!DOCTYPE html><html><body>Access to this model is restricted</body></html>", "web page", "log in first"),
    ],
)
def test_a_damaged_safetensors_file_says_so_and_to_download_it_again(tmp_path, content, says, fix):
    path = tmp_path / "ideogram4-int8-w8a8.safetensors"
    if content is None:
        content = os.urandom(4096)
    elif content.startswith(b"{"):
        content = len(content).to_bytes(8, "little") + content
    path.write_bytes(content)
    with pytest.raises(E.NotSafetensorsError) as ei:
        read_branch(path, "conditional")
    assert_names(ei.value, path, says, fix, f"found {len(content)} bytes")
    assert "pass a .safetensors file" not in str(ei.value)


def test_a_valid_safetensors_that_is_not_ideogram4_says_so_and_which_file_to_pick(tmp_path, gen):
    other = tmp_path / "some_other_dit.safetensors"  # "layers.N." keys, but nothing of Ideogram 4's layout
    save_tensors(
        other,
        {
            "layers.0.mlp.fc1.weight": torch.randn(64, 32, generator=gen),
            "layers.0.mlp.fc2.weight": torch.randn(32, 64, generator=gen),
        },
    )
    with pytest.raises(E.CheckpointError) as ei:
        read_branch(other, "conditional")
    assert_names(
        ei.value,
        other,
        "not an Ideogram 4 diffusion model",
        "ideogram4-int8-w8a8.safetensors",
        "ideogram4_fp8_scaled.safetensors",
    )
    assert "config=" not in str(ei.value) and "Ideogram4Config" not in str(ei.value)


def test_error_types_read_as_the_pack_name_not_a_module_path():
    # ComfyUI shows an error's type as "<module>.<name>" and imports a custom node under its folder path.
    import comfyui_ideogram4_int8 as pack
    from comfyui_ideogram4_int8.ideogram4.captions.problems import CaptionError
    from comfyui_ideogram4_int8.ideogram4.sampling_args import SamplingArgumentError

    classes = [E.CheckpointError, *CHECKPOINT_ERRORS, SamplingArgumentError, CaptionError]
    for cls in classes:
        assert f"{cls.__module__}.{cls.__qualname__}" == f"comfyui_ideogram4_int8.{cls.__name__}"
        assert getattr(pack, cls.__name__) is cls  # importable under the name shown
    assert sorted(pack._ERRORS) == sorted(c.__name__ for c in classes)


def test_missing_branch_prefix(tmp_path, gen):
    only_cond = write_w8a8(tmp_path / "cond-only.safetensors", {"conditional": tiny_weights(gen)["conditional"]}, TINY)
    with pytest.raises(E.MissingBranchError) as ei:
        read_branch(only_cond, "unconditional")
    assert_names(ei.value, only_cond, "unconditional.*", "conditional.*")
    stray = tampered(only_cond, tmp_path / "stray.safetensors", lambda t: t.update({"extra.weight": torch.ones(3)}))
    with pytest.raises(E.MissingBranchError) as ei:
        read_branch(stray, "conditional")
    assert_names(ei.value, stray, "extra.weight")
    with pytest.raises(ValueError, match="branch must be one of"):
        read_branch(only_cond, "negative")


def test_missing_keys_list_a_few(tmp_path, gen):
    path = write_w8a8(tmp_path / "nobase.safetensors", tiny_weights(gen), TINY, include_others=False)
    with pytest.raises(E.MissingKeysError) as ei:
        read_branch(path, "conditional")
    # norms + the indicator embedding + weight and bias of the 6 float top-level linears
    n_missing = len(TINY.other_shapes()) + 2 * 6
    assert_names(
        ei.value,
        path,
        f"{n_missing} tensors the architecture needs are missing",
        "base=",
        f"and {n_missing - 5} more",
        "adaln_proj.bias",
    )


@pytest.mark.parametrize(
    "case",
    ["wq_shape", "wq_dtype", "no_scale", "scale_shape", "smooth_length", "norm_shape", "bias_dtype", "extra_key"],
)
def test_tensor_mismatches_name_key_expected_found(tmp_path, w8a8_file, case):
    p = f"conditional.{QKV}"
    n, k = 3 * TINY.emb_dim, TINY.emb_dim

    def change(t):
        if case == "wq_shape":
            t[p + ".wq"] = t[p + ".wq"][:, :-1].contiguous()
        elif case == "wq_dtype":
            t[p + ".wq"] = t[p + ".wq"].half()
        elif case == "no_scale":
            del t[p + ".ws"]
        elif case == "scale_shape":
            t[p + ".ws"] = t[p + ".ws"][:-1].contiguous()
        elif case == "smooth_length":
            t[p + ".smooth"] = torch.ones(k + 3)
        elif case == "norm_shape":
            t["conditional.layers.1.ffn_norm2.weight"] = torch.ones(k + 1)
        elif case == "bias_dtype":
            t["conditional.layers.0.adaln_modulation.bias"] = torch.ones(4 * k, dtype=torch.int32)
        elif case == "extra_key":
            t["conditional.layers.0.attention.qkv.act_scale"] = torch.ones(k)

    bad = tampered(w8a8_file, tmp_path / f"{case}.safetensors", change)
    with pytest.raises(E.TensorMismatchError) as ei:
        read_branch(bad, "conditional")
    expect = {
        "wq_shape": (p + ".wq", f"[{n}, {k}]", f"int8 [{n}, {k - 1}]"),
        "wq_dtype": (p + ".wq", "int8", "float16"),
        "no_scale": (p + ".wq", "without scale", p + ".ws"),
        "scale_shape": (p + ".ws", f"[{n}]", f"[{n - 1}]"),
        "smooth_length": (p + ".smooth", f"[{k}]", f"[{k + 3}]"),
        "norm_shape": ("conditional.layers.1.ffn_norm2.weight", f"[{k}]", f"[{k + 1}]"),
        "bias_dtype": ("conditional.layers.0.adaln_modulation.bias", "float32", "int32"),
        "extra_key": (p + ".act_scale", "strict=False", "not part of"),
    }[case]
    assert_names(ei.value, bad, "expected", "found", *expect)
    if case == "extra_key":
        sd = read_branch(bad, "conditional", strict=False)
        assert sd.ignored == [QKV + ".act_scale"]


def test_int8_without_scale_in_comfy_file(tmp_path, gen):
    path = write_comfy_int8(tmp_path / "i.safetensors", tiny_weights(gen)["conditional"], TINY, convrot_group=None)
    bad = tampered(path, tmp_path / "bad.safetensors", lambda t: t.pop(QKV + ".weight_scale"))
    with pytest.raises(E.TensorMismatchError) as ei:
        read_branch(bad, "conditional")
    assert_names(ei.value, bad, QKV + ".weight", "without scale", QKV + ".weight_scale")


def test_unsupported_comfy_quant_format(tmp_path, gen):
    path = write_comfy_int8(tmp_path / "i.safetensors", tiny_weights(gen)["conditional"], TINY, convrot_group=None)
    bad = tampered(
        path,
        tmp_path / "nvfp4.safetensors",
        lambda t: t.update({QKV + ".comfy_quant": encode_comfy_quant({"format": "nvfp4"})}),
    )
    with pytest.raises(E.UnsupportedFormatError) as ei:
        read_branch(bad, "conditional")
    assert_names(ei.value, bad, QKV + ".comfy_quant", "nvfp4", "int8_tensorwise")


def test_base_that_does_not_match(tmp_path, gen):
    weights = tiny_weights(gen)
    path = write_w8a8(tmp_path / "w.safetensors", weights, TINY, include_others=False)
    other = dataclasses.replace(TINY, num_layers=3)  # the tiny config one block deeper
    deeper = write_float(tmp_path / "deeper.safetensors", tiny_weights(gen, other)["conditional"], other)
    with pytest.raises(E.BaseMismatchError) as ei:
        read_branch(path, "conditional", base=deeper)
    assert_names(ei.value, deeper, "num_layers", "expected num_layers = 2", "found num_layers = 3")
    deeper_norms = write_float(
        tmp_path / "deeper-norms.safetensors",
        tiny_weights(gen, other)["conditional"],
        other,
        only=is_nonlinear_or_top(other),
    )
    with pytest.raises(E.BaseMismatchError) as ei:  # same width, only norms: the depth still gives it away
        read_branch(path, "conditional", base=deeper_norms)
    assert_names(ei.value, deeper_norms, "expected num_layers = 2", "found num_layers = 3")
    good_base = write_float(tmp_path / "base.safetensors", weights["conditional"], TINY, only=is_nonlinear_or_top(TINY))
    short_norm = {"llm_cond_norm.weight": torch.ones(TINY.llm_features_dim - 1)}
    wrong_norm = tampered(good_base, tmp_path / "wrongnorm.safetensors", lambda t: t.update(short_norm))
    with pytest.raises(E.BaseMismatchError) as ei:
        read_branch(path, "conditional", base=wrong_norm)
    assert_names(ei.value, wrong_norm, "llm_cond_norm.weight", f"[{TINY.llm_features_dim}]")


def test_invalid_smooth_values_detected_at_load(tmp_path, w8a8_file):
    def zero(t):
        t[f"conditional.layers.1.{'feed_forward.w1'}.smooth"][3] = 0.0

    bad = tampered(w8a8_file, tmp_path / "zero.safetensors", zero)
    with pytest.raises(E.TensorMismatchError) as ei:
        read_branch(bad, "conditional")
    assert_names(ei.value, bad, "conditional.layers.1.feed_forward.w1.smooth", "index 3")


def test_failed_load_leaves_nothing_behind(tmp_path, w8a8_file, monkeypatch):
    """Every tensor the reader loaded is freed when the load fails late (last linear)."""
    last = TINY.linear_names()[-1]  # layers.1.adaln_modulation

    def bad_scale(t):
        t[f"conditional.{last}.ws"][0] = float("nan")

    bad = tampered(w8a8_file, tmp_path / "late.safetensors", bad_scale)
    loaded: list[weakref.ref] = []
    original = Source.load

    def tracking_load(self, key, device=None):
        t = original(self, key, device)
        loaded.append(weakref.ref(t))
        return t

    monkeypatch.setattr(Source, "load", tracking_load)
    with pytest.raises(E.TensorMismatchError) as ei:
        read_branch(bad, "conditional")
    assert_names(ei.value, f"conditional.{last}.ws", "nan")
    gc.collect()
    assert len(loaded) > 20  # it really got far before failing
    alive = [r() for r in loaded if r() is not None]
    assert not alive, f"{len(alive)} loaded tensors still alive after the failed load"


def test_dit_refuses_incomplete_or_extra_state(gen):
    from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT

    weights = tiny_weights(gen)["conditional"]
    partial = dict(weights)
    del partial["layers.1.ffn_norm2.weight"]
    with pytest.raises(ValueError, match="layers.1.ffn_norm2.weight"):
        Ideogram4DiT(TINY, state_dict=partial)
    assert "layers.0.ffn_norm2.weight" in partial  # nothing consumed from the caller's dict
    extra = dict(weights, **{"layers.0.attention.qkv.act_scale": torch.ones(3)})
    with pytest.raises(ValueError, match="unused"):
        Ideogram4DiT(TINY, state_dict=extra)


def test_a_device_that_is_not_here_is_named_with_the_fix(w8a8_file):
    if not torch.cuda.is_available():
        with pytest.raises(E.DeviceUnavailableError) as info:
            read_branch(w8a8_file, "conditional", device="cuda")
        msg = str(info.value)
        assert str(w8a8_file) in msg and "device='cuda'" in msg and "sees no CUDA GPU" in msg and "device='cpu'" in msg
        assert "pin_memory" not in msg
    with pytest.raises(E.DeviceUnavailableError, match="cuda:99"):
        read_branch(w8a8_file, "conditional", device="cuda:99")
    with pytest.raises(E.DeviceUnavailableError, match="not a torch device"):
        read_branch(w8a8_file, "conditional", device="gpu")
    assert issubclass(E.DeviceUnavailableError, ValueError)
