"""Reference Ideogram 4 DiT: one module tree for float, W8A8 (fused) and dequant runs.

State-dict keys are ComfyUI's native Ideogram 4 names (= the official checkpoint's), so the same
weights load here and into ``comfy.ldm.ideogram4``. The forward follows ComfyUI's calling
convention:

    model(x [B, 128, H/16, W/16], timesteps = sigma [B], context [B, L, 53248] | None,
          attention_mask [B, L] | None) -> -velocity, same layout as x

Internally the reference time is ``t = 1 - sigma`` (0 = noise, 1 = clean) and the reference
velocity is ``v = x0 - noise``; ComfyUI's Euler (``x += (sigma' - sigma) * out``) needs ``-v``.
``velocity()`` gives v in reference time. ``context=None`` runs the image-only sequence (the
unconditional branch of the official asymmetric CFG); with a context the sequence is
``[text | image]`` and an attention mask makes padded text tokens a separate segment.

Linears come from a factory (see ``w8a8_module``); everything else (RMSNorm, LayerNorm,
embedding, RoPE, attention) is plain torch in the compute dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import kernels
from ..kernels import ops as kernel_ops
from . import rope, smooth_fold
from .config import Ideogram4Config, LinearSpec, infer_config
from .w8a8_module import (
    QUANT_KEYS,
    FloatLinear,
    FusedGateUp,
    LinearFactory,
    W8A8Linear,
    can_fuse_gate_up,
    float_linears,
)

# Per-token role indicators (segment / embedding semantics of the official model).
PAD_INDICATOR = 0
IMAGE_INDICATOR = 2
TEXT_INDICATOR = 3
PAD_SEGMENT = -1
LLM_NORM_EPS = 1e-6
FINAL_NORM_EPS = 1e-6
QK_NORM_EPS = 1e-5
TIME_SCALE = 1e4


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, weight: torch.Tensor | None = None, dtype=None, device=None) -> None:
        super().__init__()
        self.eps = eps
        w = weight if weight is not None else torch.ones(dim, dtype=dtype, device=device)
        self.weight = nn.Parameter(w, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of 1e4 * t (t = reference time in [0, 1]): [sin | cos], float32 [B, dim]."""
    scaled = TIME_SCALE * t.to(torch.float32)
    half = dim // 2
    step = math.log(TIME_SCALE) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * -step)
    args = scaled.unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class _Holder(nn.Module):
    """Plain container so module paths equal the official key prefixes."""


class Ideogram4Block(nn.Module):
    def __init__(self, cfg: Ideogram4Config, make: Callable[[str], nn.Module], norm: Callable) -> None:
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.attention = _Holder()
        self.attention.qkv = make("attention.qkv")
        self.attention.o = make("attention.o")
        self.attention.norm_q = norm("attention.norm_q", cfg.head_dim, QK_NORM_EPS)
        self.attention.norm_k = norm("attention.norm_k", cfg.head_dim, QK_NORM_EPS)
        self.feed_forward = _Holder()
        for name in ("w1", "w2", "w3"):
            setattr(self.feed_forward, name, make(f"feed_forward.{name}"))
        for name in ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"):
            setattr(self, name, norm(name, cfg.emb_dim, cfg.norm_eps))
        self.adaln_modulation = make("adaln_modulation")

    def attend(self, x, cos, sin, mask):
        b, n, _ = x.shape
        qkv = self.attention.qkv(x).view(b, n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(dim=2)
        if x.is_cuda:
            # one fused pass per tensor (norm + rotation in float32, rounded once), like ComfyUI's
            # fused rms_rope kernel; the CPU keeps the eager ops (bit-for-bit with ComfyUI's CPU path)
            nq, nk = self.attention.norm_q, self.attention.norm_k
            q = kernel_ops.qk_norm_rope(q, nq.weight, cos, sin, nq.eps)
            k = kernel_ops.qk_norm_rope(k, nk.weight, cos, sin, nk.eps)
        else:
            q = rope.apply_rope(self.attention.norm_q(q), cos, sin)
            k = rope.apply_rope(self.attention.norm_k(k), cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.attention.o(out.transpose(1, 2).reshape(b, n, -1))

    def feed(self, x):
        ff = self.feed_forward
        fused = getattr(ff, "gate_up", None)
        if fused is not None:
            return ff.w2(fused(x))
        h = F.silu(ff.w1(x)) * ff.w3(x)
        if h.dtype == torch.float16:  # the native model clamps to fp16's range here
            h = h.clamp(-65504.0, 65504.0)
        return ff.w2(h)

    def forward(self, x, adaln_input, cos, sin, mask):
        scale_msa, gate_msa, scale_mlp, gate_mlp = self.adaln_modulation(adaln_input).chunk(4, dim=-1)
        x = x + torch.tanh(gate_msa) * self.attention_norm2(
            self.attend(self.attention_norm1(x) * (1.0 + scale_msa), cos, sin, mask)
        )
        x = x + torch.tanh(gate_mlp) * self.ffn_norm2(self.feed(self.ffn_norm1(x) * (1.0 + scale_mlp)))
        return x


class Ideogram4DiT(nn.Module):
    """The Ideogram 4 DiT (one CFG branch).

    Args:
        config: architecture (``Ideogram4Config.full()`` for the real model).
        linears: linear factory (default ``float_linears()``); see ``w8a8_module``.
        state_dict: optional weights in official key names; each linear's entries go to the
            factory, norms / embedding are taken as they are (cast to ``dtype``). Every key must
            be used. Without it, the float tensors are uninitialised: call load_state_dict.
        dtype: compute dtype of activations and float tensors (bf16 on GPU, fp32 for references).
        device: where tensors created here go (given tensors are moved only if they differ).
        label: registry model label ("conditional" / "unconditional"): linears record their GEMM
            path as "<label>/<module path>".
        consume: pop used entries from ``state_dict`` (so the caller's dict does not keep a second
            reference to tensors that the model converts).
    """

    def __init__(
        self,
        config: Ideogram4Config,
        linears: LinearFactory | None = None,
        *,
        state_dict: dict[str, torch.Tensor] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        label: str | None = None,
        consume: bool = False,
    ) -> None:
        super().__init__()
        self.config = config
        self.compute_dtype = dtype
        self.label = label
        self.smoothing: smooth_fold.FoldReport | None = None  # set by from_state_dict
        factory = linears or float_linears(dtype=dtype)
        sd = state_dict if consume or state_dict is None else dict(state_dict)
        if sd is not None:
            _check_complete(sd, config)
        specs = {s.name: s for s in config.linears(label)}

        def make(prefix: str) -> Callable[[str], nn.Module]:
            def build(local: str) -> nn.Module:
                spec = specs[prefix + local]
                entries = None if sd is None else _take_entries(sd, spec.name)
                module = factory(spec, entries)
                if device is not None:
                    module.to(device)
                return module

            return build

        def norm_factory(prefix: str):
            def build(local: str, dim: int, eps: float) -> RMSNorm:
                w = None if sd is None else sd.pop(prefix + local + ".weight")
                if w is not None:
                    w = w.to(device=device or w.device, dtype=dtype)
                return RMSNorm(dim, eps, w, dtype=dtype, device=device)

            return build

        top = make("")
        self.input_proj = top("input_proj")
        self.llm_cond_norm = norm_factory("")("llm_cond_norm", config.llm_features_dim, LLM_NORM_EPS)
        self.llm_cond_proj = top("llm_cond_proj")
        self.t_embedding = _Holder()
        self.t_embedding.mlp_in = top("t_embedding.mlp_in")
        self.t_embedding.mlp_out = top("t_embedding.mlp_out")
        self.adaln_proj = top("adaln_proj")
        emb = None if sd is None else sd.pop("embed_image_indicator.weight")
        if emb is None:
            emb = torch.zeros(2, config.emb_dim, dtype=dtype, device=device)
        self.embed_image_indicator = _Holder()
        self.embed_image_indicator.weight = nn.Parameter(
            emb.to(device=device or emb.device, dtype=dtype), requires_grad=False
        )
        self.layers = nn.ModuleList(
            Ideogram4Block(config, make(f"layers.{i}."), norm_factory(f"layers.{i}.")) for i in range(config.num_layers)
        )
        self.final_layer = _Holder()
        self.final_layer.linear = top("final_layer.linear")
        self.final_layer.adaln_modulation = top("final_layer.adaln_modulation")
        if sd:
            raise ValueError(f"Ideogram4DiT: {len(sd)} unused state-dict keys, e.g. {sorted(sd)[:5]}")

    # -- construction helpers ----------------------------------------------------------------
    @classmethod
    def from_state_dict(
        cls,
        state_dict: dict[str, torch.Tensor],
        linears: LinearFactory | None = None,
        *,
        config: Ideogram4Config | None = None,
        fold_smooth: bool = True,
        gate_up: str = smooth_fold.DEFAULT_GATE_UP,
        **kwargs,
    ) -> Ideogram4DiT:
        """Build from a state dict (e.g. ``read_branch`` output); the config is taken from the
        dict's ``.config`` attribute (read_branch sets it), else inferred from the shapes.

        ``fold_smooth`` (default on): fold every foldable SmoothQuant divide into the norm weight / weight scales
        that produce the layer's input (``smooth_fold.fold_smoothing``; ``gate_up`` picks how w1 / w3 with
        different vectors are handled), so those layers quantize their input without a divide. The caller's dict
        is not changed unless ``consume=True``. What was folded where is ``model.smoothing``."""
        if config is None:
            config = getattr(state_dict, "config", None)
        if config is None:
            shapes = {k: tuple(v.shape) for k, v in state_dict.items()}
            config = infer_config(shapes)
        if not kwargs.get("consume", False):
            state_dict = dict(state_dict)  # the fold replaces entries: never in the caller's dict
            kwargs["consume"] = True
        report = smooth_fold.fold_smoothing(state_dict, config, gate_up=gate_up if fold_smooth else "off")
        model = cls(config, linears, state_dict=state_dict, **kwargs)
        model.smoothing = report
        model._note_smoothing()
        return model

    def _note_smoothing(self) -> None:
        """Tell the registry (and so the panel) which linears still divide by a smoothing vector, and why."""
        report = getattr(self, "smoothing", None)
        for name, module in self.linear_modules().items():
            site = getattr(module, "site", None)
            if site is not None:
                kernels.REGISTRY.set_note(site, report.note(name) if report is not None else None)

    def linear_modules(self) -> dict[str, nn.Module]:
        names = set(self.config.linear_names())
        return {n: m for n, m in self.named_modules() if n in names}

    def fuse_gate_up(self, on: bool = True) -> int:
        """Run each block's feed_forward.w1 / w3 as one fused W8A8 GEMM with the SwiGLU in its epilogue.

        One-way: the fused module takes over w1's and w3's int8 weights and scales (no copy) and replaces them.
        Blocks whose w1 / w3 cannot share a GEMM keep them. Returns the number of fused blocks."""
        if not on:
            return 0
        fused = 0
        for i, layer in enumerate(self.layers):
            ff = layer.feed_forward
            if getattr(ff, "gate_up", None) is not None or not can_fuse_gate_up(ff.w1, ff.w3):
                continue
            site = f"{self.label}/layers.{i}.feed_forward.w1|w3" if self.label else None
            ff.gate_up = FusedGateUp(ff.w1, ff.w3, site=site)
            ff.w1 = ff.w3 = None
            fused += 1
        return fused

    def set_label(self, label: str | None) -> None:
        """Rename the registry call sites of every linear to "<label>/<module path>"."""
        self.label = label
        for name, module in self.linear_modules().items():
            if isinstance(module, (W8A8Linear, FloatLinear)):
                module.site = f"{label}/{name}" if label else None
        self._note_smoothing()

    def declare_paths(self) -> None:
        """List every linear in kernels.REGISTRY before it runs (path predicted, 0 calls)."""
        from .. import kernels

        self._note_smoothing()
        for module in self.linear_modules().values():
            site = getattr(module, "site", None)
            if site is None:
                continue
            if isinstance(module, W8A8Linear):
                try:
                    path, reason = kernels.select_path(
                        module.weight.device, module.out_features, module.in_features, module.path
                    )
                except ValueError as exc:
                    path, reason = kernels.PATH_DEQUANT, str(exc)
            else:
                path, reason = kernels.PATH_BF16, getattr(module, "reason", "float layer")
            kernels.REGISTRY.declare(site, path, reason, module.out_features, module.in_features)

    # -- token packing ---------------------------------------------------------------------------
    def latent_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, gh, gw] with C ordered (c, pi, pj) -> [B, gh*gw, C] with features (pi, pj, c)."""
        b, c, gh, gw = x.shape
        p = self.config.patch_size
        return x.view(b, c // (p * p), p, p, gh, gw).permute(0, 4, 5, 2, 3, 1).reshape(b, gh * gw, c)

    def tokens_to_latent(self, tokens: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
        b, _, c = tokens.shape
        p = self.config.patch_size
        return tokens.reshape(b, gh, gw, p, p, c // (p * p)).permute(0, 5, 3, 4, 1, 2).reshape(b, c, gh, gw)

    # -- forward ---------------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor,
        timesteps,
        context: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """ComfyUI convention: timesteps = sigma; returns -velocity in x's layout (compute dtype)."""
        return -self.velocity(x, 1.0 - _as_batch(timesteps, x), context, attention_mask)

    def velocity(
        self, x: torch.Tensor, t, context: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Reference convention: t = 1 - sigma (0 = noise); returns v = x0 - noise."""
        cfg = self.config
        if x.dim() != 4 or x.shape[1] != cfg.in_channels:
            raise ValueError(f"Ideogram4DiT: x must be [B, {cfg.in_channels}, H/16, W/16]; got {list(x.shape)}")
        b, _, gh, gw = x.shape
        t = _as_batch(t, x).to(torch.float32)
        dtype = self.compute_dtype
        img = self.latent_to_tokens(x.to(dtype))
        n_img = img.shape[1]
        device = x.device
        img_pos = rope.image_position_ids(gh, gw, device)
        if context is None:
            tokens, positions, mask = img, img_pos, None
            indicator = torch.full((b, n_img), IMAGE_INDICATOR, dtype=torch.long, device=device)
            n_text = 0
        else:
            if context.dim() != 3 or context.shape[0] != b or context.shape[2] != cfg.llm_features_dim:
                raise ValueError(
                    f"Ideogram4DiT: context must be [{b}, L, {cfg.llm_features_dim}]; got {list(context.shape)}"
                )
            n_text = context.shape[1]
            tokens = torch.cat([img.new_zeros(b, n_text, img.shape[2]), img], dim=1)
            positions = torch.cat([rope.text_position_ids(n_text, device), img_pos], dim=0)
            indicator = torch.cat(
                [
                    torch.full((b, n_text), TEXT_INDICATOR, dtype=torch.long, device=device),
                    torch.full((b, n_img), IMAGE_INDICATOR, dtype=torch.long, device=device),
                ],
                dim=1,
            )
            mask = None
            if attention_mask is not None:
                if tuple(attention_mask.shape) != (b, n_text):
                    raise ValueError(
                        f"Ideogram4DiT: attention_mask must be [{b}, {n_text}]; got {list(attention_mask.shape)}"
                    )
                pad = attention_mask.to(device) == 0
                indicator[:, :n_text][pad] = PAD_INDICATOR
                segment = torch.ones(b, n_text + n_img, dtype=torch.long, device=device)
                segment[:, :n_text][pad] = PAD_SEGMENT
                mask = (segment[:, :, None] == segment[:, None, :])[:, None]  # [B, 1, L, L], True = attend
        out = self._backbone(tokens, t, context, indicator, positions, mask, n_text)
        return self.tokens_to_latent(out[:, n_text:], gh, gw)

    def _backbone(self, tokens, t, context, indicator, positions, mask, n_text):
        cfg = self.config
        dtype = self.compute_dtype
        image_rows = (indicator == IMAGE_INDICATOR).to(dtype).unsqueeze(-1)
        h = self.input_proj(tokens * image_rows) * image_rows
        t_cond = self.t_embedding.mlp_out(F.silu(self.t_embedding.mlp_in(timestep_embedding(t, cfg.emb_dim).to(dtype))))
        adaln_input = F.silu(self.adaln_proj(t_cond.unsqueeze(1)))  # [B, 1, adaln_dim]
        if context is not None:
            text_rows = (indicator[:, :n_text] == TEXT_INDICATOR).to(dtype).unsqueeze(-1)
            text = self.llm_cond_proj(self.llm_cond_norm(context.to(dtype) * text_rows)) * text_rows
            h = torch.cat([h[:, :n_text] + text, h[:, n_text:]], dim=1)
        h = h + self.embed_image_indicator.weight.to(dtype)[(indicator == IMAGE_INDICATOR).long()]
        cos, sin = rope.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
        for layer in self.layers:
            h = layer(h, adaln_input, cos, sin, mask)
        scale = 1.0 + self.final_layer.adaln_modulation(F.silu(adaln_input))
        return self.final_layer.linear(F.layer_norm(h, (h.shape[-1],), eps=FINAL_NORM_EPS) * scale)


def _as_batch(t, x: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(t, device=x.device)
    if t.dim() == 0:
        t = t.expand(x.shape[0])
    if t.shape != (x.shape[0],):
        raise ValueError(f"Ideogram4DiT: timesteps must be a scalar or [B={x.shape[0]}]; got {list(t.shape)}")
    return t


def _take_entries(sd: dict, name: str) -> dict[str, torch.Tensor]:
    entries = {}
    for key in QUANT_KEYS:
        t = sd.pop(f"{name}.{key}", None)
        if t is not None:
            entries[key] = t
    return entries


def _check_complete(sd: dict, config: Ideogram4Config) -> None:
    """Every tensor the architecture needs is present (before anything is built)."""
    missing = [k for k in config.other_shapes() if k not in sd]
    for spec in config.linears():
        if f"{spec.name}.weight" not in sd:
            missing.append(f"{spec.name}.weight")
        elif sd[f"{spec.name}.weight"].dtype == torch.int8 and f"{spec.name}.weight_scale" not in sd:
            missing.append(f"{spec.name}.weight_scale")
        if spec.bias and f"{spec.name}.bias" not in sd:
            missing.append(f"{spec.name}.bias")
    if missing:
        raise ValueError(f"Ideogram4DiT: state dict lacks {len(missing)} tensors, e.g. {missing[:5]}")


__all__ = ["Ideogram4DiT", "LinearSpec", "timestep_embedding"]
