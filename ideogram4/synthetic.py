"""Synthetic Ideogram 4 checkpoints in every format the reader accepts.

Seeded random float weights with outlier channels (``RandomWeights``), SmoothQuant vectors
derived from them, and writers for:

  * ``write_w8a8``      the transformerlab two-branch W8A8 file (.wq / .ws / .smooth, protected
                        feed_forward.w2 layers as plain bf16, optionally without norms etc.);
  * ``write_comfy_int8`` ComfyUI int8_tensorwise per-channel, with or without ConvRot;
  * ``write_comfy_fp8``  ComfyUI fp8_scaled (comfy_quant, or the legacy scaled_fp8 layout);
  * ``write_float``      plain bf16 / fp16 / fp32 (also: a base checkpoint of the non-linear
                        tensors with ``only=...``).

Every writer streams tensor by tensor (``safetensors_io.write_safetensors``) and computes each
layer when its keys come up, so ``RandomWeights(Ideogram4Config.full(), device="cuda")`` writes
full-size 9.3B files from a machine whose RAM holds one layer. Tests, the demo and the
benchmarks all use these writers.
"""

from __future__ import annotations

import collections
import hashlib
import math
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping

import torch

from .. import kernels
from . import convrot
from .checkpoint import CONFIG_METADATA_KEY
from .config import Ideogram4Config, LinearSpec
from .formats.comfy_quant import encode_comfy_quant
from .safetensors_io import write_safetensors

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# inputs of these linears come out of an RMSNorm whose weight carries the outlier channels
SMOOTHED_FROM = {"attention.qkv": "attention_norm1", "feed_forward.w1": "ffn_norm1", "feed_forward.w3": "ffn_norm1"}
OUTLIER_NORMS = ("attention_norm1", "ffn_norm1", "llm_cond_norm")


def _seed_for(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:7], "little")


class RandomWeights(Mapping):
    """Deterministic random float weights of one branch, generated per key on demand.

    ``weights[key]`` is the same tensor for the same (seed, key) on the same device type.
    Outliers: ``outliers`` input channels of the norms in OUTLIER_NORMS get weight ~``outlier_gain``
    (activation outlier channels, what SmoothQuant is for), and a few output rows of each linear
    are 4x larger (per-channel scale outliers).
    """

    def __init__(
        self,
        config: Ideogram4Config,
        seed: int = 0,
        *,
        device="cpu",
        dtype=torch.float32,
        outliers: int | None = None,
        outlier_gain: float = 16.0,
    ) -> None:
        self.config = config
        self.seed = int(seed)
        self.device = torch.device(device)
        self.dtype = dtype
        self.outliers = max(1, config.emb_dim // 64) if outliers is None else int(outliers)
        self.outlier_gain = float(outlier_gain)
        self._shapes = config.float_shapes()
        self._specs = {s.name: s for s in config.linears()}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._shapes:
            raise KeyError(key)
        g = torch.Generator(device=self.device).manual_seed(_seed_for(self.seed, key))
        shape = self._shapes[key]
        randn = lambda *s: torch.randn(*s, generator=g, device=self.device, dtype=torch.float32)  # noqa: E731
        module, leaf = key.rsplit(".", 1)
        if module in self._specs:
            spec = self._specs[module]
            if leaf == "bias":
                t = 0.02 * randn(*shape)
            else:
                gain = 0.5 if module.endswith("adaln_modulation") else 1.0
                t = randn(*shape) * (gain / math.sqrt(spec.in_features))
                rows = torch.randperm(shape[0], generator=g, device=self.device)[: max(1, shape[0] // 64)]
                t[rows] *= 4.0
        elif key == "embed_image_indicator.weight":
            t = 0.5 * randn(*shape)
        else:  # RMSNorm weights
            t = 1.0 + 0.1 * randn(*shape)
            if any(key.endswith(n + ".weight") for n in OUTLIER_NORMS) and self.outliers:
                idx = self.outlier_channels(key)
                t[idx] = self.outlier_gain * (1.0 + 0.25 * torch.rand(len(idx), generator=g, device=self.device))
        return t.to(self.dtype)

    def outlier_channels(self, norm_key: str) -> torch.Tensor:
        n = self._shapes[norm_key][0]
        g = torch.Generator().manual_seed(_seed_for(self.seed, "outliers:" + norm_key))
        return torch.randperm(n, generator=g)[: min(self.outliers, n)].to(self.device)

    def __iter__(self):
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def materialize(self) -> dict[str, torch.Tensor]:
        return {k: self[k] for k in self._shapes}


def smoothquant_vector(weight: torch.Tensor, act_amax: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """s_k = amax|x_k|^alpha / amax_n|W_nk|^(1-alpha), float32 [K], > 0."""
    w_amax = weight.float().abs().amax(dim=0).clamp_min(1e-5)
    s = act_amax.float().abs().clamp_min(1e-5).pow(alpha) / w_amax.pow(1.0 - alpha)
    return s.clamp_min(1e-5)


def smooth_vectors(
    weights: Mapping, config: Ideogram4Config, alpha: float = 0.5, *, names: Iterable[str] | None = None, seed: int = 0
) -> dict[str, torch.Tensor]:
    """SmoothQuant vectors s = amax_x^alpha / amax_w^(1-alpha) (no calibration data here).

    Default: the linears that read a normed activation (qkv, w1, w3, llm_cond_proj), with the norm weight as the
    activation-magnitude proxy. ``names``: a vector for each of these linears instead (the transformerlab file
    smooths every quantized layer); those without a norm in front get a seeded activation-amax proxy (log-normal
    channel magnitudes, 1/64 of the channels 8x larger), so every layer's vector is its own (w1 and w3 differ
    through their weights)."""
    normed = {"llm_cond_proj": "llm_cond_norm.weight"}
    for i in range(config.num_layers):
        for lin, norm in SMOOTHED_FROM.items():
            normed[f"layers.{i}.{lin}"] = f"layers.{i}.{norm}.weight"
    wanted = list(normed) if names is None else list(names)
    out = {}
    for name in wanted:
        w = weights[name + ".weight"]
        if name in normed:
            amax = weights[normed[name]]
        else:
            k = w.shape[1]
            g = torch.Generator().manual_seed(_seed_for(seed, "act-amax:" + name))
            amax = torch.exp(0.5 * torch.randn(k, generator=g))
            amax[torch.randperm(k, generator=g)[: max(1, k // 64)]] *= 8.0
            amax = amax.to(w.device)
        out[name] = smoothquant_vector(w, amax, alpha)
    return out


def default_protected(config: Ideogram4Config) -> list[str]:
    """feed_forward.w2 of every odd block (17 of 34 in the full model, like the real file)."""
    return [f"layers.{i}.feed_forward.w2" for i in range(1, config.num_layers, 2)]


def _metadata(config: Ideogram4Config, fmt: str) -> dict[str, str]:
    return {CONFIG_METADATA_KEY: config.to_json(), "format": fmt, "writer": "comfyui-ideogram4-int8 synthetic"}


class _LayerCache:
    """Computes a layer's stored tensors once while its keys are written (sorted keys are adjacent)."""

    def __init__(self, compute: Callable[[str], dict[str, torch.Tensor]]) -> None:
        self.compute = compute
        self.cache: collections.OrderedDict = collections.OrderedDict()

    def get(self, module: str, leaf: str) -> torch.Tensor:
        if module not in self.cache:
            self.cache[module] = self.compute(module)
            while len(self.cache) > 1:
                self.cache.popitem(last=False)
        return self.cache[module][leaf]


def _names(select, config: Ideogram4Config) -> frozenset[str]:
    if select is None:
        return config.default_quantized()
    if select is True:
        return frozenset(config.linear_names())
    if select is False:
        return frozenset()
    return frozenset(select)


def write_w8a8(
    path: str | os.PathLike,
    branches: Mapping[str, Mapping[str, torch.Tensor]],
    config: Ideogram4Config,
    *,
    smooth: str | Mapping[str, Mapping[str, torch.Tensor]] | None = "auto",
    protected: Iterable[str] | None = None,
    quantized: Iterable[str] | bool | None = None,
    include_others: bool = True,
    scale_dtype: torch.dtype = torch.float32,
    scale_shape: str = "N",
    float_dtype: torch.dtype = torch.bfloat16,
    progress=None,
) -> pathlib.Path:
    """The transformerlab W8A8 layout: ``<branch>.<m>.wq`` int8 [N,K], ``.ws`` [N] | [N,1] in
    ``scale_dtype``, ``.smooth`` float32 [K] (where a vector is given), ``.bias``; protected linears
    as plain ``.weight`` in ``float_dtype``.

    Args:
        branches: {"conditional": weights, "unconditional": weights} (either may be left out).
        smooth: "auto" (``smooth_vectors`` per branch), None, or {branch: {linear: [K]}}.
        protected: linears stored bf16 (default ``default_protected``).
        quantized: linears stored as W8A8 (default ``config.default_quantized()`` minus protected).
        include_others: also store norms, the embedding and the unquantized top-level linears
            (False imitates a file that needs a base checkpoint).
        scale_shape: "N" or "N1" ([N, 1]).
    """
    protected = frozenset(default_protected(config) if protected is None else protected)
    qnames = _names(quantized, config) - protected
    specs: dict = {}
    owners: dict[str, tuple[str, str, str]] = {}  # file key -> (branch, module, leaf)
    smooths: dict[str, dict] = {}
    for branch, weights in branches.items():
        if smooth == "auto":
            smooths[branch] = smooth_vectors(weights, config)
        elif smooth is None:
            smooths[branch] = {}
        else:
            smooths[branch] = dict(smooth.get(branch, {}))
        for spec in config.linears():
            p = f"{branch}.{spec.name}"
            n, k = spec.out_features, spec.in_features
            if spec.name in qnames:
                specs[p + ".wq"] = (torch.int8, (n, k))
                specs[p + ".ws"] = (scale_dtype, (n,) if scale_shape == "N" else (n, 1))
                if spec.name in smooths[branch]:
                    specs[p + ".smooth"] = (torch.float32, (k,))
            elif spec.name in protected or include_others:
                specs[p + ".weight"] = (float_dtype, (n, k))
            else:
                continue
            if spec.bias:
                specs[p + ".bias"] = (float_dtype, (n,))
        if include_others:
            for key, shape in config.other_shapes().items():
                specs[f"{branch}.{key}"] = (float_dtype, shape)
    for key in specs:
        branch, rest = key.split(".", 1)
        module, leaf = rest.rsplit(".", 1)
        owners[key] = (branch, module, leaf)

    def compute(bm: str) -> dict[str, torch.Tensor]:
        branch, module = bm.split("|")
        w = branches[branch][module + ".weight"]
        s = smooths[branch].get(module)
        q, scale = kernels.quantize_weight_ref(w, s)
        out = {"wq": q, "ws": scale.to(scale_dtype).reshape(specs[f"{branch}.{module}.ws"][1])}
        if s is not None:
            out["smooth"] = s.float()
        return out

    cache = _LayerCache(compute)

    def produce(key: str) -> torch.Tensor:
        branch, module, leaf = owners[key]
        if leaf in ("wq", "ws", "smooth"):
            return cache.get(f"{branch}|{module}", leaf)
        return branches[branch][f"{module}.{leaf}"].to(float_dtype)

    return write_safetensors(path, specs, produce, _metadata(config, "transformerlab-w8a8"), progress)


def w8a8_state(
    weights: Mapping[str, torch.Tensor],
    config: Ideogram4Config,
    *,
    branch: str = "conditional",
    smooth: str | Mapping[str, torch.Tensor] | None = "auto",
    protected: Iterable[str] | None = None,
    quantized: Iterable[str] | bool | None = None,
    float_dtype: torch.dtype = torch.bfloat16,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
):
    """In memory, what ``read_branch(write_w8a8({branch: weights}, ...), branch, dtype=dtype)`` returns.

    For benchmarks that need a full-size branch without writing a 20 GB file: each layer is computed
    where ``weights`` lives (e.g. ``RandomWeights(..., device="cuda")``), then moved to ``device``.
    Float tensors go through ``float_dtype`` (the file's storage) before ``dtype``, scales and
    smoothing vectors are float32, as in the file. Returns a ``BranchStateDict``.
    """
    from .checkpoint import BranchStateDict

    protected = frozenset(default_protected(config) if protected is None else protected)
    qnames = _names(quantized, config) - protected
    smooths = smooth_vectors(weights, config) if smooth == "auto" else dict(smooth or {})
    device = torch.device(device)
    out = BranchStateDict()
    out.config, out.file, out.branch = config, "<synthetic w8a8_state>", branch
    out.layers, out.from_base, out.ignored = {}, [], []

    def stored_float(t: torch.Tensor) -> torch.Tensor:
        return t.to(float_dtype).to(device=device, dtype=dtype)

    for spec in config.linears():
        m = spec.name
        w = weights[m + ".weight"]
        if m in qnames:
            q, scale = kernels.quantize_weight_ref(w, smooths.get(m))
            out[m + ".weight"], out[m + ".weight_scale"] = q.to(device), scale.to(device)
            if m in smooths:
                out[m + ".input_smooth"] = smooths[m].float().to(device)
            out.layers[m] = "W8A8 (synthetic, in memory)"
        else:
            out[m + ".weight"] = stored_float(w)
            out.layers[m] = "float (synthetic, in memory)"
        del w
        if spec.bias:
            out[m + ".bias"] = stored_float(weights[m + ".bias"])
    for key in config.other_shapes():
        out[key] = stored_float(weights[key])
    return out


def write_comfy_int8(
    path: str | os.PathLike,
    weights: Mapping[str, torch.Tensor],
    config: Ideogram4Config,
    *,
    convrot_group: int | None = 256,
    quantized: Iterable[str] | bool | None = None,
    tensorwise: bool = False,
    float_dtype: torch.dtype = torch.bfloat16,
    prefix: str = "",
    progress=None,
) -> pathlib.Path:
    """ComfyUI ``int8_tensorwise``: ``<m>.weight`` int8, ``<m>.weight_scale`` float32 [N, 1] (or []
    with ``tensorwise``), ``<m>.comfy_quant`` JSON; ConvRot (``convrot_group``) on every layer whose
    K it divides. One branch per file; ``prefix`` e.g. "model.diffusion_model."."""
    qnames = _names(quantized, config)
    specs: dict = {}
    spec_of: dict[str, LinearSpec] = {s.name: s for s in config.linears()}
    for key, shape in config.float_shapes().items():
        module, leaf = key.rsplit(".", 1)
        if module in qnames and leaf == "weight":
            specs[prefix + key] = (torch.int8, shape)
            specs[prefix + module + ".weight_scale"] = (torch.float32, () if tensorwise else (shape[0], 1))
            marker = _int8_marker(spec_of[module], convrot_group)
            specs[prefix + module + ".comfy_quant"] = (torch.uint8, (len(marker),))
        else:
            specs[prefix + key] = (float_dtype, shape)

    def compute(module: str) -> dict[str, torch.Tensor]:
        spec = spec_of[module]
        w = weights[module + ".weight"].float()
        group = convrot_group if convrot_group and spec.in_features % convrot_group == 0 else None
        if group:
            w = convrot.rotate_weight(w, group)
        if tensorwise:
            scale = w.abs().amax().clamp_min(1e-12) / 127.0
            q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
            s = scale.reshape(())
        else:
            q, s = kernels.quantize_weight_ref(w)
            s = s.reshape(-1, 1)
        return {"weight": q, "weight_scale": s.float(), "comfy_quant": _int8_marker(spec, convrot_group)}

    cache = _LayerCache(compute)

    def produce(key: str) -> torch.Tensor:
        local = key[len(prefix) :]
        module, leaf = local.rsplit(".", 1)
        if module in qnames and leaf in ("weight", "weight_scale", "comfy_quant"):
            return cache.get(module, leaf)
        return weights[local].to(float_dtype)

    return write_safetensors(path, specs, produce, _metadata(config, "comfy-int8"), progress)


def _int8_marker(spec: LinearSpec, group: int | None) -> torch.Tensor:
    info: dict = {"format": "int8_tensorwise"}
    if group and spec.in_features % group == 0:
        info.update(convrot=True, convrot_groupsize=group)
    return encode_comfy_quant(info)


def write_comfy_fp8(
    path: str | os.PathLike,
    weights: Mapping[str, torch.Tensor],
    config: Ideogram4Config,
    *,
    legacy: bool = False,
    quantized: Iterable[str] | bool | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    float_dtype: torch.dtype = torch.bfloat16,
    prefix: str = "",
    progress=None,
) -> pathlib.Path:
    """ComfyUI fp8_scaled: ``<m>.weight`` fp8, ``<m>.weight_scale`` float32 [] and a comfy_quant
    marker; ``legacy``: ``<m>.scale_weight`` and a top-level ``scaled_fp8`` marker instead."""
    qnames = _names(quantized, config)
    fmt = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}[fp8_dtype]
    marker = encode_comfy_quant({"format": fmt})
    scale_leaf = "scale_weight" if legacy else "weight_scale"
    specs: dict = {}
    for key, shape in config.float_shapes().items():
        module, leaf = key.rsplit(".", 1)
        if module in qnames and leaf == "weight":
            specs[prefix + key] = (fp8_dtype, shape)
            specs[prefix + module + "." + scale_leaf] = (torch.float32, ())
            if not legacy:
                specs[prefix + module + ".comfy_quant"] = (torch.uint8, (len(marker),))
        else:
            specs[prefix + key] = (float_dtype, shape)
    if legacy:
        specs["scaled_fp8"] = (fp8_dtype, (0,))

    def compute(module: str) -> dict[str, torch.Tensor]:
        w = weights[module + ".weight"].float()
        scale = (w.abs().amax() / FP8_MAX[fp8_dtype]).clamp_min(1e-12)
        return {"weight": (w / scale).to(fp8_dtype), scale_leaf: scale.reshape(()).float(), "comfy_quant": marker}

    cache = _LayerCache(compute)

    def produce(key: str) -> torch.Tensor:
        if key == "scaled_fp8":
            return torch.empty(0, dtype=fp8_dtype)
        local = key[len(prefix) :]
        module, leaf = local.rsplit(".", 1)
        if module in qnames and leaf in ("weight", scale_leaf, "comfy_quant"):
            return cache.get(module, leaf)
        return weights[local].to(float_dtype)

    return write_safetensors(path, specs, produce, _metadata(config, "comfy-fp8"), progress)


def write_float(
    path: str | os.PathLike,
    weights: Mapping[str, torch.Tensor],
    config: Ideogram4Config,
    *,
    dtype: torch.dtype = torch.bfloat16,
    only: Callable[[str], bool] | None = None,
    prefix: str = "",
    progress=None,
) -> pathlib.Path:
    """Plain float checkpoint in official names; ``only(key)`` selects a subset (e.g. a base file)."""
    specs = {prefix + k: (dtype, s) for k, s in config.float_shapes().items() if only is None or only(k)}
    return write_safetensors(
        path, specs, lambda key: weights[key[len(prefix) :]].to(dtype), _metadata(config, "float"), progress
    )


def is_nonlinear_or_top(config: Ideogram4Config) -> Callable[[str], bool]:
    """Selector for a base file: everything a W8A8 file written with include_others=False lacks."""
    quantizable = config.default_quantized()
    protected = set(default_protected(config))

    def keep(key: str) -> bool:
        module = key.rsplit(".", 1)[0]
        return module not in quantizable and module not in protected

    return keep


__all__ = [
    "RandomWeights",
    "smooth_vectors",
    "smoothquant_vector",
    "default_protected",
    "write_w8a8",
    "w8a8_state",
    "write_comfy_int8",
    "write_comfy_fp8",
    "write_float",
    "is_nonlinear_or_top",
]
