"""GPU checks of the model side (run on the device machine): fused path, device loading, memory."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
from comfyui_ideogram4_int8.ideogram4.errors import TensorMismatchError
from comfyui_ideogram4_int8.ideogram4.formats.quantize_on_load import quantize_weight
from comfyui_ideogram4_int8.ideogram4.safetensors_io import Header, save_tensors
from comfyui_ideogram4_int8.ideogram4.sampler import make_noise, sample
from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, write_comfy_int8, write_w8a8
from comfyui_ideogram4_int8.ideogram4.w8a8_module import dequant_linears, float_linears, w8a8_linears
from ideogram4_checks import TINY, cosine, raw, seed_of, tiny_weights

pytestmark = pytest.mark.cuda
DEMO = Ideogram4Config.demo()


def _pair(tmp_path, gen, cfg=DEMO):
    weights = {b: RandomWeights(cfg, seed_of(gen)).materialize() for b in ("conditional", "unconditional")}
    return weights, write_w8a8(tmp_path / "w.safetensors", weights, cfg)


def test_fused_dit_on_gpu_matches_bf16(tmp_path, gen):
    weights, path = _pair(tmp_path, gen)
    ctx = torch.randn(1, 24, DEMO.llm_features_dim, generator=gen).cuda()
    x = torch.randn(1, DEMO.in_channels, 32, 32, generator=gen).cuda()
    sigma = torch.tensor([0.6], device="cuda")
    for branch, c in (("conditional", ctx), ("unconditional", None)):
        label = f"gpu-{branch}"
        kernels.REGISTRY.clear(label)
        sd = read_branch(path, branch, device="cuda")
        assert all(t.device.type == "cuda" for t in sd.values())
        w8 = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), dtype=torch.bfloat16, device="cuda", label=label)
        dq = Ideogram4DiT.from_state_dict(
            read_branch(path, branch, device="cuda"), dequant_linears(), dtype=torch.bfloat16, device="cuda"
        )
        ref = Ideogram4DiT(
            DEMO, float_linears(dtype=torch.bfloat16), state_dict=weights[branch], dtype=torch.bfloat16, device="cuda"
        )
        with torch.no_grad():
            a, d, r = w8(x, sigma, context=c), dq(x, sigma, context=c), ref(x, sigma, context=c)
        assert cosine(a, r) >= 0.99 and cosine(a, d) >= 0.999
        paths = {rec.layer: rec.path for rec in kernels.REGISTRY.layers(label)}
        assert paths["layers.0.attention.qkv"] == kernels.PATH_TRITON
        assert {paths[n] for n in sd.quantized_layers() if n in paths} == {kernels.PATH_TRITON}


def test_convrot_layers_run_on_the_fused_kernel(tmp_path, gen):
    w = tiny_weights(gen)["conditional"]
    path = write_comfy_int8(tmp_path / "i.safetensors", w, TINY, convrot_group=16)
    model = Ideogram4DiT.from_state_dict(
        read_branch(path, "conditional", device="cuda"),
        w8a8_linears(),
        dtype=torch.bfloat16,
        device="cuda",
        label="gpu-convrot",
    )
    ref = Ideogram4DiT(TINY, float_linears(dtype=torch.float32), state_dict=w, device="cuda")
    x = torch.randn(2, TINY.in_channels, 4, 6, generator=gen).cuda()
    sigma = torch.tensor([0.3, 0.8], device="cuda")
    with torch.no_grad():
        assert cosine(model(x, sigma), ref(x, sigma)) >= 0.99
    recs = {r.layer: r for r in kernels.REGISTRY.layers("gpu-convrot")}
    assert recs["layers.0.attention.qkv"].path == kernels.PATH_TRITON
    assert "ConvRot" in recs["layers.0.attention.qkv"].reason


def test_quantize_on_load_gpu_equals_cpu(gen):
    w = torch.randn(300, 512, generator=gen).to(torch.float8_e4m3fn)
    scale = torch.tensor(0.021)
    qc, sc = quantize_weight(w, scale)
    qg, sg = quantize_weight(w.cuda(), scale.cuda(), max_chunk_bytes=4 * 512 * 64)
    assert torch.equal(qc, qg.cpu()) and torch.equal(sc, sg.cpu())


def test_failed_gpu_load_frees_everything(tmp_path, gen):
    _, path = _pair(tmp_path, gen)
    tensors = raw(path)
    last = f"unconditional.{DEMO.linear_names()[-1]}.ws"
    tensors[last][5] = float("inf")
    bad = save_tensors(tmp_path / "bad.safetensors", tensors, Header(path).metadata)
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(TensorMismatchError):
        read_branch(bad, "unconditional", device="cuda")
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def test_load_peak_is_final_plus_one_layer(tmp_path, gen):
    _, path = _pair(tmp_path, gen)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    sd = read_branch(path, "conditional", device="cuda")
    largest = max(t.numel() * t.element_size() for t in sd.values())
    slack = 512 * (len(sd) + 8)  # the caching allocator rounds every block up to 512 bytes
    model = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), dtype=torch.bfloat16, device="cuda", consume=True)
    del sd
    torch.cuda.synchronize()
    final = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    model_bytes = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    assert final <= model_bytes + slack, (final, model_bytes)
    # at most one layer in flight on top of the final model (its weight + the small scale/bias copies)
    assert peak - final <= 2 * largest + slack, (peak, final, largest)


def test_gpu_sampling_deterministic(tmp_path, gen):
    _, path = _pair(tmp_path, gen)
    models = {}
    for b in ("conditional", "unconditional"):
        models[b] = Ideogram4DiT.from_state_dict(
            read_branch(path, b, device="cuda"), w8a8_linears(), dtype=torch.bfloat16, device="cuda"
        )
    ctx = torch.randn(1, 8, DEMO.llm_features_dim, generator=gen).cuda()
    seed = seed_of(gen)

    def run():
        noise = make_noise(seed, 128, 128, channels=DEMO.in_channels, device="cuda")
        with torch.no_grad():
            return sample(
                models["conditional"],
                models["unconditional"],
                ctx,
                width=128,
                height=128,
                preset="Turbo 12",
                noise=noise,
            )

    a, b = run(), run()
    assert torch.equal(a, b)


def test_load_memory_bench_smoke(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "comfyui_ideogram4_int8.bench.probes.load_memory",
            "--config",
            "demo",
            "--dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "r.json"),
            "--forward",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "HOLDS" in out.stdout
