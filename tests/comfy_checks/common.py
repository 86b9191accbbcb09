"""The process setup and the helpers the checks share: the command line, ComfyUI set up in this process
(--cpu unless COMFY_GPU=1), the synthetic model files, the loader, inputs and the pack's switches."""

import contextlib
import os
import sys

comfy_dir, pack_parent, work, check, seed = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
sys.path.insert(0, pack_parent)
sys.path.insert(0, comfy_dir)
os.chdir(comfy_dir)
GPU = os.environ.get("COMFY_GPU") == "1"  # tests/cuda/test_branch_device_gpu.py: ComfyUI on the GPU(s)
sys.argv = [sys.argv[0]] if GPU else [sys.argv[0], "--cpu"]
os.environ["HF_HUB_OFFLINE"] = "1"  # no network in tests: a hub request must be answered from the (empty) cache
os.environ["HF_HOME"] = os.path.join(work, "hf_home")

if check == "protected_fp8":  # the triton-fp8 path on the CPU interpreter: set before any kernel is built
    os.environ["TRITON_INTERPRET"] = "1"
import torch  # noqa: E402
from comfy.cli_args import args  # noqa: E402

args.cpu = not GPU
if check == "compile":  # ComfyUI's attention on a GPU (PyTorch SDPA); its CPU default reads free memory (psutil),
    args.use_pytorch_cross_attention = True  # which dynamo cannot trace: a graph break that is not the pack's
import comfy.model_base  # noqa: E402
import comfy.model_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.ops  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.supported_models  # noqa: E402
import comfy.utils  # noqa: E402
import folder_paths  # noqa: E402
from comfy_stock import stock_sizes  # noqa: E402
from comfyui_ideogram4_int8.ideogram4 import read_branch, synthetic  # noqa: E402
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config  # noqa: E402
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT  # noqa: E402
from comfyui_ideogram4_int8.ideogram4.w8a8_module import dequantize_entries, w8a8_linears  # noqa: E402
from comfyui_ideogram4_int8.kernels import settings  # noqa: E402
from comfyui_ideogram4_int8.nodes import loader_nodes, sampler_nodes  # noqa: E402

MODELS = os.path.join(work, "models", "diffusion_models")
os.makedirs(MODELS, exist_ok=True)
folder_paths.add_model_folder_path("diffusion_models", MODELS, is_default=True)
CFG = Ideogram4Config.demo()  # real latent width (128 channels): native Flux2 latents and nodes work unchanged
torch.set_num_threads(1)
torch.manual_seed(seed)
G = torch.Generator().manual_seed(seed)


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def weights(branch_seed):
    return synthetic.RandomWeights(CFG, branch_seed).materialize()


def write_all():
    """Synthetic files of every format; returns {name: path}."""
    w = {"conditional": weights(seed), "unconditional": weights(seed + 1)}
    out = {"w8a8": synthetic.write_w8a8(os.path.join(MODELS, "i4_w8a8.safetensors"), w, CFG)}
    for b, tag in (("conditional", ""), ("unconditional", "_unconditional")):
        out[f"int8{tag}"] = synthetic.write_comfy_int8(
            os.path.join(MODELS, f"i4{tag}_int8_convrot.safetensors"), w[b], CFG
        )
        out[f"fp8{tag}"] = synthetic.write_comfy_fp8(os.path.join(MODELS, f"i4{tag}_fp8_scaled.safetensors"), w[b], CFG)
        out[f"bf16{tag}"] = synthetic.write_float(os.path.join(MODELS, f"i4{tag}_bf16.safetensors"), w[b], CFG)
    return {k: str(v) for k, v in out.items()}, w


def load(weights_name, uncond_name=loader_nodes.SAME_FILE, dtype="fp32", path="auto", base="none", **extra):
    out = loader_nodes.Ideogram4Int8Loader.execute(
        weights=weights_name,
        unconditional_weights=uncond_name,
        base=base,
        unconditional_base="none",
        compute_dtype=dtype,
        gemm_path=path,
        **extra,
    )
    return out.result


def reference(path, branch, gemm_path=None, label="ref"):
    st = read_branch(path, branch, dtype=torch.float32)
    return Ideogram4DiT.from_state_dict(st, w8a8_linears(path=gemm_path), config=CFG, dtype=torch.float32, label=label)


def inputs(batch=2, gh=6, gw=4, n_text=5):
    x = torch.randn(batch, CFG.in_channels, gh, gw, generator=G)
    ctx = torch.randn(batch, n_text, CFG.llm_features_dim, generator=G)
    sigma = torch.rand(batch, generator=G) * 0.9 + 0.05
    mask = torch.ones(batch, n_text, dtype=torch.long)
    mask[0, 3:] = 0
    return x, ctx, sigma, mask


CASES = ("image_only", "conditional", "conditional_masked")


def forward_cases(fn, x, ctx, sigma, mask):
    with torch.no_grad():
        return {
            "image_only": fn(x, sigma),
            "conditional": fn(x, sigma, context=ctx),
            "conditional_masked": fn(x, sigma, context=ctx, attention_mask=mask),
        }


@contextlib.contextmanager
def demo_sizes():
    """ComfyUI's Ideogram4 model config with the demo architecture's sizes (detection reads only in_channels and
    the block count from the weights; the rest is the class's unet_extra_config, here the stock DiT's sizes of
    ``CFG`` as ``comfy_stock`` names them)."""
    cls = comfy.supported_models.Ideogram4
    saved = cls.unet_extra_config
    cls.unet_extra_config = dict(saved, **stock_sizes(CFG, leave_out=("in_channels", "num_layers")))
    try:
        yield
    finally:
        cls.unet_extra_config = saved


def native_unet(path, dtype=None):
    """ComfyUI's own UNETLoader path (load_diffusion_model) for a demo-sized file."""
    with demo_sizes():
        opts = {"dtype": dtype} if dtype is not None else {}
        return comfy.sd.load_diffusion_model(path, model_options=opts)


def dequantized_state(st):
    """A read_branch result with every int8 linear replaced by its float weight (smoothing / ConvRot undone)."""
    floats = {}
    for k, v in st.items():
        m, leaf = k.rsplit(".", 1)
        if leaf == "weight" and v.dtype == torch.int8:
            entries = {
                e: st[f"{m}.{e}"]
                for e in ("weight", "weight_scale", "input_smooth", "convrot_groupsize")
                if f"{m}.{e}" in st
            }
            floats[k] = dequantize_entries(entries, torch.float32)
        elif leaf not in ("weight_scale", "input_smooth", "convrot_groupsize"):
            floats[k] = v.float()
    return floats


def latent_node(cond, uncond, ctx, seed_, preset="Turbo 12", w=256, h=256, **kw):
    """The LATENT of our sampler node."""
    out = sampler_nodes.Ideogram4Int8Sampler.execute(
        model=cond, model_negative=uncond, positive=[[ctx, {}]], seed=seed_, preset=preset, width=w, height=h, **kw
    )
    return out.result[0]["samples"]


def _set(name, value):
    """The pack's switch ``name`` set to ``value`` (None: unset), and the switches read again."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    settings.reload()


@contextlib.contextmanager
def env_var(name, value):
    """The pack's switch ``name`` at ``value`` inside the block, as it was after."""
    old = os.environ.get(name)
    _set(name, value)
    try:
        yield
    finally:
        _set(name, old)


def experiments(*entries):
    """The experiments ``entries`` added to the list (the suite's CPU pin stays) inside the block."""
    listed = os.environ.get(settings.EXPERIMENTS_VAR, "")
    return env_var(settings.EXPERIMENTS_VAR, ",".join(e for e in (listed, *entries) if e))


def streaming_budget(patcher, streamed_blocks):
    """A weight budget under which ``patcher``'s plan streams exactly ``streamed_blocks`` blocks."""
    sizes = patcher._block_bytes()
    fixed = patcher.model_size() - sum(sizes)
    budget = fixed + sum(sizes)
    step = max(1024, budget // 4000)
    while budget > 0:
        budget -= step
        try:
            plan = patcher.stream_plan(budget)
        except Exception:  # noqa: BLE001
            break
        if len(plan.streamed) == streamed_blocks:
            return budget
    raise AssertionError(f"no budget streams {streamed_blocks} blocks")
