"""The ComfyUI benchmark's smoke run (``bench.comfy --config demo``: the tiny demo model on the CPU, inside ComfyUI's
own Python) through both samplers it measures: the pack's sampler node and ComfyUI's own Dual Model CFG Guider +
SamplerCustomAdvanced. Numbers from it mean nothing; what is checked is that each sampler ran the pack's MODELs to a
finite latent, that the run says which sampler it used, and that the native one reached the pack's linears."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _comfyui_python() -> tuple[pathlib.Path, str]:
    """(ComfyUI's directory, the Python that runs it)."""
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    return comfy_dir, os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")


def _pack_env(tmp_path: pathlib.Path) -> dict:
    """An environment in which ComfyUI's Python imports this checkout as the pack (no interpreter mode)."""
    pack_parent = tmp_path / "pack"
    pack_parent.mkdir()
    (pack_parent / "comfyui_ideogram4_int8").symlink_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(pack_parent)
    return env


def _result_of(script: str, tmp_path: pathlib.Path, timeout: int) -> dict:
    """The JSON a script run in ComfyUI's Python printed after "RESULT "."""
    _, python = _comfyui_python()
    env = _pack_env(tmp_path)
    run = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.comfyui
@pytest.mark.parametrize("sampler", ["pack", "native"])
def test_the_demo_benchmark_samples_through_each_sampler(tmp_path, sampler):
    comfy_dir, python = _comfyui_python()
    out_json, latents = tmp_path / "out.json", tmp_path / "latents"
    cmd = [
        python,
        "-m",
        "comfyui_ideogram4_int8.bench.comfy",
        "--comfyui",
        str(comfy_dir),
        "--workdir",
        str(tmp_path / "work"),
        "--config",
        "demo",
        "--peers",
        "ours-w8a8",
        "--steps",
        "3",
        "--sampler",
        sampler,
        "--latents",
        str(latents),
        "--out",
        str(out_json),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_pack_env(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out_json.read_text())
    assert result["info"]["sampler"] == sampler
    peer = result["peers"]["ours-w8a8"]
    assert "error" not in peer, peer
    assert peer["step_ms"] > 0
    # both branches' linears ran through the pack's op (3 steps, both passes), whichever sampler drove them
    for branch in ("conditional", "unconditional"):
        assert sum(peer["paths"][branch].values()) > 0, (branch, peer["paths"])
    latent = torch.load(latents / "ours-w8a8.pt")
    assert latent.shape[1] == 128 and torch.isfinite(latent).all()


@pytest.mark.comfyui
def test_the_synthetic_text_encoder_has_the_layout_comfyui_detects_as_ideogram4s(tmp_path):
    """bench/text_encoder.py's file layout, from ComfyUI's own encoder module: ComfyUI's detection takes it for
    Qwen3-VL 8B (the Ideogram 4 encoder users load), every language-model linear is stored e4m3 with its scale and
    marker, and a file key maps back onto the module key ComfyUI's loader will fill."""
    comfy_dir, _ = _comfyui_python()
    script = f"""
import json, sys, torch
sys.argv = [sys.argv[0]]
sys.path.insert(0, {str(comfy_dir)!r})
from comfy.cli_args import args
args.cpu = True
import comfy.sd, comfy.utils
from comfyui_ideogram4_int8.bench import text_encoder as te
specs = te.specs()
sd = {{k: torch.empty(s, dtype=d, device="meta") for k, (d, s) in specs.items()}}
loaded = comfy.utils.state_dict_prefix_replace(
    dict(sd), {{"model.language_model.": "model.", "model.visual.": "visual.", "lm_head.": "model.lm_head."}}
)
module = set(k.split(".transformer.", 1)[1] for k in te._encoder_module().state_dict() if ".transformer." in k)
print("RESULT " + json.dumps({{
    "detected": str(comfy.sd.detect_te_model(sd)),
    "quantized": sum(te.is_quantized(k) for k in specs),
    "scales": sum(k.endswith(".weight_scale") for k in specs),
    "markers": sum(k.endswith(".comfy_quant") for k in specs),
    "fp8": sum(d == torch.float8_e4m3fn for d, _ in specs.values()),
    "unmatched": sorted(k for k in loaded if not k.endswith((".weight_scale", ".comfy_quant")) and k not in module)[:5],
    "missing": sorted(k for k in module if k not in loaded)[:5],
}}))
"""
    r = _result_of(script, tmp_path, timeout=300)
    assert r["detected"] == "TEModel.QWEN3VL_8B"
    assert r["quantized"] == 36 * 7 == r["scales"] == r["markers"] == r["fp8"]  # 36 layers x q/k/v/o/gate/up/down
    assert r["unmatched"] == [] and r["missing"] == []


@pytest.mark.comfyui
def test_the_benchs_vae_file_loads_and_decodes_through_comfyuis_path(tmp_path):
    """--decode's VAE: the file the parent writes (``peers.write_layout``, the real decoder width) loads through the
    child's path (``flux2_vae.load``: ``comfy.sd.VAE`` on the file, as VAELoader) as a Flux2 VAE of that width, and
    ComfyUI's VAE Decode node (``flux2_vae.decode``) turns a 128-channel latent into an image 16 times its side."""
    comfy_dir, _ = _comfyui_python()
    work = tmp_path / "work"
    work.mkdir()
    script = f"""
import json, pathlib, sys, torch
sys.argv = [sys.argv[0]]
sys.path.insert(0, {str(comfy_dir)!r})
from comfy.cli_args import args
args.cpu = True
from comfyui_ideogram4_int8.bench import flux2_vae
from comfyui_ideogram4_int8.bench.comfy import peers
files = peers.write_layout(peers.VAE, None, pathlib.Path({str(work)!r}), 0)
vae = flux2_vae.load(files["vae"])
image = flux2_vae.decode(vae, torch.randn(1, 128, 4, 4, generator=torch.Generator().manual_seed(0)))
print("RESULT " + json.dumps({{
    "file": files["vae"].name,
    "decoder_in": vae.first_stage_model.decoder.conv_in.out_channels,
    "latent_channels": vae.latent_channels,
    "shape": list(image.shape),
    "finite": bool(torch.isfinite(image).all()),
    "range": [float(image.min()), float(image.max())],
}}))
"""
    r = _result_of(script, tmp_path, timeout=600)
    assert r["file"] == "flux2-vae.safetensors"
    assert r["decoder_in"] == 128 * 4  # the real width x the last ch_mult: ComfyUI read the width from the file
    assert r["latent_channels"] == 128
    assert r["shape"] == [1, 64, 64, 3] and r["finite"]
    assert 0.0 <= r["range"][0] <= r["range"][1] <= 1.0  # the node's output range (process_output)
