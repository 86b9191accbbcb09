"""Architecture configuration of the Ideogram 4 DiT, and the key/shape table derived from it.

``Ideogram4Config.full()`` is the published 9.3B model (34 blocks, 18 heads x 256, SwiGLU 12288,
AdaLN 512, 53248 text features, MRoPE (24, 20, 20), theta 5e6). ``tiny()`` and ``demo()`` are
small configs with the same structure, for tests and the demo.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

# Per-block linears: (name, in, out, bias) with sizes as attribute names of the config.
BLOCK_LINEARS = (
    ("attention.qkv", "emb_dim", "qkv_dim", False),
    ("attention.o", "emb_dim", "emb_dim", False),
    ("feed_forward.w1", "emb_dim", "intermediate_size", False),
    ("feed_forward.w2", "intermediate_size", "emb_dim", False),
    ("feed_forward.w3", "emb_dim", "intermediate_size", False),
    ("adaln_modulation", "adaln_dim", "modulation_dim", True),
)
TOP_LINEARS = (
    ("input_proj", "in_channels", "emb_dim", True),
    ("llm_cond_proj", "llm_features_dim", "emb_dim", True),
    ("t_embedding.mlp_in", "emb_dim", "emb_dim", True),
    ("t_embedding.mlp_out", "emb_dim", "emb_dim", True),
    ("adaln_proj", "emb_dim", "adaln_dim", True),
    ("final_layer.linear", "emb_dim", "in_channels", True),
    ("final_layer.adaln_modulation", "adaln_dim", "emb_dim", True),
)
# Linears quantized on load by default (bf16 / fp8 sources): every block linear and the text
# projection. The small top-level ones (M = batch size, or the first/last layer) stay float.
DEFAULT_QUANTIZE_TOP = ("llm_cond_proj",)


@dataclasses.dataclass(frozen=True)
class LinearSpec:
    """One linear layer of the architecture: ``name`` is its module path (no ``.weight``)."""

    name: str
    in_features: int
    out_features: int
    bias: bool
    site: str | None = None  # registry call-site name, "<label>/<name>", set when labelled


@dataclasses.dataclass(frozen=True)
class Ideogram4Config:
    in_channels: int = 128
    num_layers: int = 34
    num_heads: int = 18
    head_dim: int = 256
    intermediate_size: int = 12288
    adaln_dim: int = 512
    llm_features_dim: int = 53248
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    norm_eps: float = 1e-5
    patch_size: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "mrope_section", tuple(int(s) for s in self.mrope_section))
        positive = (
            "in_channels",
            "num_layers",
            "num_heads",
            "head_dim",
            "intermediate_size",
            "adaln_dim",
            "llm_features_dim",
        )
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Ideogram4Config.{name} must be >= 1; got {getattr(self, name)}")
        if self.head_dim % 2:
            raise ValueError(f"Ideogram4Config.head_dim must be even for RoPE; got {self.head_dim}")
        if self.in_channels % (self.patch_size**2):
            raise ValueError(
                f"Ideogram4Config.in_channels={self.in_channels} must be a multiple of patch_size**2="
                f"{self.patch_size**2} (a token is a {self.patch_size}x{self.patch_size} patch of VAE channels)"
            )
        if len(self.mrope_section) != 3:
            raise ValueError(f"Ideogram4Config.mrope_section must have 3 entries (t, h, w); got {self.mrope_section}")
        half = self.head_dim // 2
        for axis in (1, 2):
            if 3 * self.mrope_section[axis] > half:
                raise ValueError(
                    f"Ideogram4Config.mrope_section={self.mrope_section}: the interleaved h/w sections need "
                    f"3*section <= head_dim/2 ({half}); lower them or raise head_dim"
                )

    # -- derived sizes -----------------------------------------------------------------------
    @property
    def emb_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return 3 * self.emb_dim

    @property
    def modulation_dim(self) -> int:
        return 4 * self.emb_dim

    @property
    def ae_channels(self) -> int:
        return self.in_channels // (self.patch_size**2)

    # -- presets -----------------------------------------------------------------------------
    @classmethod
    def full(cls) -> Ideogram4Config:
        """The published Ideogram 4.0 DiT (9.3B parameters in linears)."""
        return cls()

    @classmethod
    def tiny(cls) -> Ideogram4Config:
        """Smallest useful config: fast on the CPU and on Triton's interpreter (tests)."""
        return cls(
            in_channels=16,
            num_layers=2,
            num_heads=2,
            head_dim=32,
            intermediate_size=128,
            adaln_dim=32,
            llm_features_dim=128,
            mrope_section=(6, 5, 5),
        )

    @classmethod
    def demo(cls) -> Ideogram4Config:
        """The demo's embedded model: real latent width (128 channels), 4 blocks."""
        return cls(
            in_channels=128,
            num_layers=4,
            num_heads=4,
            head_dim=64,
            intermediate_size=512,
            adaln_dim=64,
            llm_features_dim=256,
            mrope_section=(12, 10, 10),
        )

    # -- serialisation (safetensors metadata) -----------------------------------------------
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Ideogram4Config:
        data = json.loads(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"Ideogram4Config JSON has unknown fields {sorted(unknown)}")
        return cls(**data)

    # -- key / shape tables ------------------------------------------------------------------
    def linears(self, label: str | None = None) -> Iterator[LinearSpec]:
        """Every linear layer, top-level ones first, then block by block."""

        def spec(name, fin, fout, bias):
            site = f"{label}/{name}" if label else None
            return LinearSpec(name, getattr(self, fin), getattr(self, fout), bias, site)

        for name, fin, fout, bias in TOP_LINEARS:
            yield spec(name, fin, fout, bias)
        for i in range(self.num_layers):
            for name, fin, fout, bias in BLOCK_LINEARS:
                yield spec(f"layers.{i}.{name}", fin, fout, bias)

    def linear_names(self) -> list[str]:
        return [s.name for s in self.linears()]

    def other_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every non-linear tensor (norm weights, the indicator embedding) and its shape."""
        shapes = {
            "llm_cond_norm.weight": (self.llm_features_dim,),
            "embed_image_indicator.weight": (2, self.emb_dim),
        }
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes[p + "attention.norm_q.weight"] = (self.head_dim,)
            shapes[p + "attention.norm_k.weight"] = (self.head_dim,)
            for norm in ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"):
                shapes[p + norm + ".weight"] = (self.emb_dim,)
        return shapes

    def float_shapes(self) -> dict[str, tuple[int, ...]]:
        """The 458 (full) tensors of an unquantized checkpoint, with their shapes."""
        shapes = {}
        for s in self.linears():
            shapes[s.name + ".weight"] = (s.out_features, s.in_features)
            if s.bias:
                shapes[s.name + ".bias"] = (s.out_features,)
        shapes.update(self.other_shapes())
        return shapes

    def default_quantized(self) -> frozenset[str]:
        """Linears quantized on load when the source is bf16 / fp8 (see DEFAULT_QUANTIZE_TOP)."""
        names = {s.name for s in self.linears() if s.name.startswith("layers.")}
        return frozenset(names | set(DEFAULT_QUANTIZE_TOP))

    def linear_parameter_count(self) -> int:
        return sum(s.in_features * s.out_features for s in self.linears())


def infer_config(shapes: dict[str, tuple[int, ...]], base: Ideogram4Config | None = None) -> Ideogram4Config:
    """Config from the tensor shapes of a (partial) checkpoint in official names.

    Sizes the weights determine (layers, widths) come from ``shapes``; RoPE settings, which no
    weight carries, come from ``base`` (default: the full model). Linears may be given as
    ``<m>.weight`` shapes [N, K]. Raises ValueError naming the missing evidence.
    """
    base = base or Ideogram4Config.full()

    def shape_of(name):
        return shapes.get(name + ".weight")

    layers = {int(k.split(".")[1]) for k in shapes if k.startswith("layers.") and k.split(".")[1].isdigit()}
    if not layers:
        raise ValueError("no 'layers.N.' tensors: not an Ideogram 4 DiT checkpoint")
    num_layers = max(layers) + 1
    qkv = shape_of("layers.0.attention.qkv")
    w1 = shape_of("layers.0.feed_forward.w1")
    ada = shape_of("layers.0.adaln_modulation")
    if qkv is None or w1 is None or ada is None:
        raise ValueError("layers.0 lacks attention.qkv / feed_forward.w1 / adaln_modulation weights")
    emb = qkv[1]
    norm_q = shapes.get("layers.0.attention.norm_q.weight")
    head_dim = norm_q[0] if norm_q else base.head_dim
    if emb % head_dim:
        raise ValueError(f"emb dim {emb} is not a multiple of head_dim {head_dim}; pass the config explicitly")
    inp = shape_of("input_proj")
    llm = shape_of("llm_cond_proj") or (None, shapes.get("llm_cond_norm.weight", (base.llm_features_dim,))[0])
    mrope = base.mrope_section
    if 3 * max(mrope[1], mrope[2]) > head_dim // 2:
        raise ValueError(
            f"head_dim {head_dim} is too small for mrope_section {mrope}; pass the config explicitly "
            "(synthetic files carry it in their metadata)"
        )
    return dataclasses.replace(
        base,
        in_channels=inp[1] if inp else base.in_channels,
        num_layers=num_layers,
        num_heads=emb // head_dim,
        head_dim=head_dim,
        intermediate_size=w1[0],
        adaln_dim=ada[1],
        llm_features_dim=llm[1],
    )
