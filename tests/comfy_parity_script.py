"""Run inside a real ComfyUI's Python: our reference DiT vs ComfyUI's native Ideogram 4 model.

Usage: <comfy python> comfy_parity_script.py COMFYUI_DIR PACK_PARENT_DIR SEED
Prints one JSON line: relative errors per case (fp32, identical tiny weights).
"""

import json
import os
import sys

comfy_dir, pack_parent, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, pack_parent)
sys.path.insert(0, comfy_dir)
os.chdir(comfy_dir)
sys.argv = [sys.argv[0], "--cpu"]

import torch  # noqa: E402
from comfy.cli_args import args  # noqa: E402

args.cpu = True
import comfy.ops  # noqa: E402
from comfy.ldm.ideogram4.model import Ideogram4Transformer2DModel  # noqa: E402
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config  # noqa: E402
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT  # noqa: E402
from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights  # noqa: E402

torch.manual_seed(seed)
results = {}
# "rope256": the full model's head_dim 256 and MRoPE (24, 20, 20) in a one-block model
ROPE256 = Ideogram4Config(in_channels=16, num_layers=1, num_heads=1, head_dim=256, intermediate_size=64, adaln_dim=16,
                          llm_features_dim=32)
for cfg_name, cfg in (("tiny", Ideogram4Config.tiny()), ("demo", Ideogram4Config.demo()), ("rope256", ROPE256)):
    weights = RandomWeights(cfg, seed).materialize()
    native = Ideogram4Transformer2DModel(
        in_channels=cfg.in_channels, num_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        attention_head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size, adaln_dim=cfg.adaln_dim,
        llm_features_dim=cfg.llm_features_dim, rope_theta=cfg.rope_theta, mrope_section=cfg.mrope_section,
        norm_eps=cfg.norm_eps, dtype=torch.float32, operations=comfy.ops.disable_weight_init,
    )
    native.load_state_dict(weights, strict=True)
    ours = Ideogram4DiT(cfg, state_dict=weights, dtype=torch.float32)
    assert sorted(native.state_dict()) == sorted(ours.state_dict()), "state-dict keys differ"
    b, gh, gw, n_text = 2, 5, 7, 6
    x = torch.randn(b, cfg.in_channels, gh, gw)
    ctx = torch.randn(b, n_text, cfg.llm_features_dim)
    sigma = torch.rand(b)
    mask = torch.ones(b, n_text, dtype=torch.long)
    mask[0, 4:] = 0
    with torch.no_grad():
        for case, kw in (("image_only", {}), ("conditional", {"context": ctx}),
                         ("conditional_masked", {"context": ctx, "attention_mask": mask})):
            ref = native(x, sigma, **kw)
            got = ours(x, sigma, **kw)
            rel = ((got - ref).norm() / ref.norm()).item()
            results[f"{cfg_name}/{case}"] = {"rel_err": rel, "max_abs": (got - ref).abs().max().item(),
                                             "ref_norm": ref.norm().item()}
print(json.dumps(results))
