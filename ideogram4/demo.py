"""``python -m comfyui_ideogram4_int8 demo``: the pack's main job on an embedded tiny model.

1. builds a small Ideogram-4-architecture DiT pair (conditional + unconditional) with seeded
   random weights, outlier channels and SmoothQuant vectors;
2. writes it as a transformerlab-layout W8A8 file (both branches, protected bf16 layers);
3. loads both branches back through ``read_branch`` into W8A8 DiTs;
4. samples a latent with a preset through the W8A8 path (the fused Triton GEMM on a CUDA GPU;
   on the CPU the labelled cublas-int8 fallback) and the same sampling with the float models;
5. writes a PNG preview (W8A8 | bf16 reference), prints the GEMM-path table and the
   W8A8-vs-bf16 fidelity, and writes ``demo_summary.json``.
"""

from __future__ import annotations

import json
import pathlib
import time

import torch

from .. import kernels
from .checkpoint import read_branch
from .config import Ideogram4Config
from .dit import Ideogram4DiT
from .preview import save_preview
from .sampler import make_noise, sample
from .schedule import get_preset
from .synthetic import RandomWeights, write_w8a8
from .w8a8_module import dequant_linears, float_linears, w8a8_linears

MODEL_SEEDS = {"conditional": 4, "unconditional": 5}  # the embedded default model
TEXT_TOKENS = 24
DEMO_SIZE = 256  # pixels: a 16 x 16 latent, 256 image tokens
FIDELITY_MIN = 0.99


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _device(name: str | None) -> torch.device:
    if name:
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("demo: --device cuda asked for, but torch sees no CUDA GPU (use --device cpu)")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def path_table(labels: list[str]) -> list[dict]:
    """Rows (model, path, layers, reason) from kernels.REGISTRY for the given model labels."""
    rows = []
    for label in labels:
        groups: dict[tuple[str, str], int] = {}
        for rec in kernels.REGISTRY.layers(label):
            key = (rec.path, rec.reason or "fastest path")
            groups[key] = groups.get(key, 0) + 1
        for (path, reason), n in sorted(groups.items(), key=lambda kv: kernels.PATHS.index(kv[0][0])):
            rows.append({"model": label, "path": path, "layers": n, "reason": reason})
    return rows


def _print_table(rows: list[dict]) -> None:
    print(f"\n{'model':<14} {'GEMM path':<13} {'layers':>6}  why")
    print("-" * 100)
    for r in rows:
        print(f"{r['model']:<14} {r['path']:<13} {r['layers']:>6}  {r['reason']}")


def run_demo(args) -> int:
    t_start = time.perf_counter()
    out = pathlib.Path(getattr(args, "out", None) or "demo_out")
    seed = int(getattr(args, "seed", 0) or 0)
    preset = get_preset(getattr(args, "preset", None) or "Turbo 12")
    device = _device(getattr(args, "device", None))
    dtype = torch.bfloat16
    cfg = Ideogram4Config.demo()
    out.mkdir(parents=True, exist_ok=True)
    print(f"Ideogram 4 W8A8 demo: {cfg.num_layers}-block model (emb {cfg.emb_dim}, {cfg.num_heads} heads), "
          f"preset {preset.name}, {DEMO_SIZE}x{DEMO_SIZE} px, seed {seed}, device {device}")  # fmt: skip

    # 1-2. embedded model -> W8A8 file
    weights = {b: RandomWeights(cfg, s).materialize() for b, s in MODEL_SEEDS.items()}
    ckpt = write_w8a8(out / "ideogram4-demo-w8a8.safetensors", weights, cfg)
    print(f"wrote {ckpt} ({ckpt.stat().st_size / 1e6:.1f} MB, both branches, W8A8 + protected bf16 layers)")

    # 3. load through the real reader, build W8A8 and float models
    kernels.REGISTRY.clear()
    w8, ref, dq = {}, {}, {}
    for branch in MODEL_SEEDS:
        sd = read_branch(ckpt, branch, device=device, dtype=dtype)
        w8[branch] = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), dtype=dtype, device=device, label=branch)
        w8[branch].declare_paths()
        ref[branch] = Ideogram4DiT(cfg, float_linears(dtype=dtype), state_dict=weights[branch], dtype=dtype,
                                   device=device)  # fmt: skip
        sd = read_branch(ckpt, branch, device=device, dtype=dtype)
        dq[branch] = Ideogram4DiT.from_state_dict(sd, dequant_linears(), dtype=dtype, device=device,
                                                  label=f"dequant-{branch[:6]}")  # fmt: skip

    g = torch.Generator("cpu").manual_seed(1234)
    context = torch.randn(1, TEXT_TOKENS, cfg.llm_features_dim, generator=g).to(device)
    noise = make_noise(seed, DEMO_SIZE, DEMO_SIZE, channels=cfg.in_channels, device=device)

    # single-forward fidelity at the first sigma, per branch and path
    sigma0 = preset.sigmas(DEMO_SIZE, DEMO_SIZE)[:1].to(device)
    fidelity = {}
    with torch.no_grad():
        for branch, ctx in (("conditional", context), ("unconditional", None)):
            x0 = noise * sigma0
            r = ref[branch](x0, sigma0, context=ctx).float()
            fidelity[f"{branch} forward: W8A8 vs bf16"] = _cos(w8[branch](x0, sigma0, context=ctx).float(), r)
            fidelity[f"{branch} forward: dequant-bf16 vs bf16"] = _cos(dq[branch](x0, sigma0, context=ctx).float(), r)

        # 4. sample through the W8A8 path, then the float reference with the same noise
        t0 = time.perf_counter()
        lat_w8 = sample(w8["conditional"], w8["unconditional"], context, width=DEMO_SIZE, height=DEMO_SIZE,
                        preset=preset, noise=noise)  # fmt: skip
        t_w8 = time.perf_counter() - t0
        lat_ref = sample(ref["conditional"], ref["unconditional"], context, width=DEMO_SIZE, height=DEMO_SIZE,
                         preset=preset, noise=noise)  # fmt: skip
    fidelity["sampled latent: W8A8 vs bf16 (cosine)"] = _cos(lat_w8, lat_ref)
    rel_latent = _rel(lat_w8, lat_ref)

    # 5. outputs
    png = save_preview(out / "demo_preview.png", [lat_w8[0], lat_ref[0]])
    rows = path_table(list(MODEL_SEEDS))
    _print_table(rows)
    print(f"\n{'fidelity (cosine similarity)':<48} value")
    print("-" * 60)
    for k, v in fidelity.items():
        print(f"{k:<48} {v:.5f}")
    print(f"{'sampled latent: relative L2 error':<48} {rel_latent:.5f}")
    ok = all(v >= FIDELITY_MIN for v in fidelity.values())
    summary = {
        "device": str(device), "dtype": str(dtype).replace("torch.", ""), "preset": preset.name, "seed": seed,
        "size": [DEMO_SIZE, DEMO_SIZE], "config": json.loads(cfg.to_json()), "checkpoint": str(ckpt),
        "preview": str(png), "gemm_paths": rows, "fidelity": fidelity, "latent_rel_err": rel_latent,
        "w8a8_sampling_seconds": t_w8, "total_seconds": time.perf_counter() - t_start, "ok": ok,
        "environment": kernels.environment_report(),
    }  # fmt: skip
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    quant_paths = sorted({r["path"] for r in rows if r["path"] != kernels.PATH_BF16})
    print(f"\npreview: {png}  (left: W8A8 via {'/'.join(quant_paths)}, right: bf16 reference)")
    print(f"summary: {out / 'demo_summary.json'}")
    print(f"W8A8 sampling {t_w8:.1f} s, total {summary['total_seconds']:.1f} s — "
          + ("fidelity OK" if ok else f"FIDELITY BELOW {FIDELITY_MIN}"))  # fmt: skip
    return 0 if ok else 1
