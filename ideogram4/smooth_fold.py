"""SmoothQuant folding: each linear's activation divide moved, at load, into whatever produces the activation.

A W8A8 linear stored with a SmoothQuant vector s (``<m>.input_smooth``, the transformerlab file's ``.smooth``)
quantizes ``x / s`` per token and multiplies it by its int8 weight, which stores W·diag(s). Done at run time the
divide makes the activation quantizer several times slower. Where the activation comes out of something with a
per-channel scale, 1/s is folded into that scale once, here, and the linear runs without the divide: the attention
and FFN norms' weights (qkv, w1|w3, llm_cond_proj), the v rows of attention.qkv's weight scale (attention.o: the
attention output is a convex combination of v rows) and w3's weight scale (w2: silu(w1 x) * (w3 x) is linear in
each of w3's output channels). A fold into a weight scale changes only the float epilogue; a fold into a norm
weight changes the rounding of the activation. Layers whose input comes through SiLU, a sinusoid, a non-affine norm
or the latent itself keep their divide (``KEPT``, with the reason in words a user can read).

w1 / w3 share one norm but may carry different vectors s1, s3 (``GATE_UP_MODES``): one shared vector ("geo", "max",
"min", "w1"; both weights re-quantized to it, then one quantizer pass and the fused SwiGLU GEMM), or "ratio" (s1
folded, w3 keeps a run-time divide by s3 / s1). ``DEFAULT_GATE_UP`` = "min": the only shared vector that makes the
pair cost nothing at run time while staying the most accurate in the error measurements; "ratio" adds no error but
costs a dividing pass and two GEMMs per FFN, and stays one switch away (``gate_up=``; in ComfyUI the experiment
``smooth-fold=ratio``). The modes, the fold table and the measurements: docs/design/smooth-fold.md.

State after the fold (still the in-memory form of ``w8a8_module``): a folded linear keeps ``<m>.input_smooth`` = s
(its int8 weight still stores W·diag(s): LoRA conversions need it) and gains ``<m>.input_folded`` = f, the part of
s already applied upstream; at run time its input is divided by s / f only (nothing when f == s). A state that
already holds ``input_folded`` (a model saved after the fold) is left as it is.

The inverse (LoRA on a folded model: the real weights from the stored ones and back) is at the end; the ComfyUI
ops (``nodes/runtime/int8_ops.py``) only wire it to ComfyUI's weight functions. ComfyUI-free. The fold runs once, at
load; the inverse runs where ComfyUI applies a LoRA (when it patches the weights, or per call in lowvram mode).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, MutableMapping

import torch

from .config import Ideogram4Config
from .formats.quantize_on_load import row_absmax, rows_per_chunk

SMOOTH = "input_smooth"
FOLDED = "input_folded"

GATE_UP_MODES = {
    "geo": "one shared vector sqrt(s1·s3); w1 and w3 re-quantized to it",
    "max": "one shared vector max(s1, s3); w1 and w3 re-quantized to it",
    "min": "one shared vector min(s1, s3) (SmoothQuant of the concatenated w1|w3); both re-quantized to it",
    "w1": "one shared vector: w1's own; w3 re-quantized to it",
    "ratio": "w1's vector folded; w3 divides by s3 / s1 at run time (two quantizer passes)",
}
DEFAULT_GATE_UP = "min"

# status of a layer that carries a smoothing vector
FOLDED_STATUS = "folded"  # no divide at run time
PARTLY = "partly folded"  # a divide by a ratio remains (gate/up mode "ratio")
KEPT_STATUS = "kept"  # the whole divide runs at run time
ALREADY = "already folded"  # the state came folded (a model saved after the fold)

# why these layers keep their divide (by module path without the block prefix)
KEPT = {
    "adaln_modulation": "its input is SiLU of the timestep embedding: nothing with a per-channel scale in front "
    "of it (one row per sample, so the divide costs next to nothing)",
    "final_layer.adaln_modulation": "its input is SiLU of the timestep embedding: nothing with a per-channel scale "
    "in front of it (one row per sample)",
    "t_embedding.mlp_in": "its input is the sinusoidal timestep features, computed at run time (one row per sample)",
    "t_embedding.mlp_out": "its input comes through SiLU (one row per sample)",
    "adaln_proj": "its input is t_embedding.mlp_out's output, bias included: not folded for a one-row layer",
    "input_proj": "its input is the latent itself: nothing in front of it to fold into",
    "final_layer.linear": "its input is LayerNorm(x)·(1 + final_layer.adaln_modulation(...)): the constant 1 makes "
    "a fold rewrite that layer's bias, not scale it; not done for one 128-wide layer",
}


@dataclasses.dataclass(frozen=True)
class FoldSite:
    """Where the input of ``consumer`` comes from, when a per-channel scale sits there.

    kind "norm": the RMSNorm weight ``producer + ".weight"`` (its output channels are the consumer's K);
    kind "rows": the output rows [start, stop) of the linear ``producer`` (its weight_scale)."""

    consumer: str
    kind: str
    producer: str
    start: int = 0
    stop: int = 0
    words: str = ""


def fold_sites(config: Ideogram4Config) -> dict[str, FoldSite]:
    """{consumer linear: FoldSite} for every linear whose input has a per-channel scale in front of it."""
    e = config.emb_dim
    sites = {"llm_cond_proj": FoldSite("llm_cond_proj", "norm", "llm_cond_norm", words="llm_cond_norm's weight")}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        sites[p + "attention.qkv"] = FoldSite(
            p + "attention.qkv", "norm", p + "attention_norm1", words="attention_norm1's weight"
        )
        for lin in ("feed_forward.w1", "feed_forward.w3"):
            sites[p + lin] = FoldSite(p + lin, "norm", p + "ffn_norm1", words="ffn_norm1's weight")
        sites[p + "attention.o"] = FoldSite(
            p + "attention.o",
            "rows",
            p + "attention.qkv",
            2 * e,
            3 * e,
            words="the v-projection scales of attention.qkv",
        )
        sites[p + "feed_forward.w2"] = FoldSite(
            p + "feed_forward.w2",
            "rows",
            p + "feed_forward.w3",
            0,
            config.intermediate_size,
            words="feed_forward.w3's output scales",
        )
    return sites


def kept_reason(name: str) -> str:
    local = re.sub(r"^layers\.\d+\.", "", name)
    return KEPT.get(local, "nothing with a per-channel scale in front of its input")


def runtime_divisor(smooth: torch.Tensor | None, folded: torch.Tensor | None) -> torch.Tensor | None:
    """What a linear's input is divided by at run time: s / f (None when f == s, or when there is no s).

    Every argument float32 [K] (or None). With f but no s (a partner's vector folded upstream of a linear that
    has none of its own) the input must be multiplied back: 1 / f."""
    if folded is None:
        return smooth
    if smooth is None:
        return 1.0 / folded
    folded = folded.to(smooth.device)
    if torch.equal(smooth, folded):
        return None
    return smooth / folded


@dataclasses.dataclass
class LayerFold:
    """What happened to one smoothed linear's divide."""

    name: str
    status: str
    where: str  # into what (folded) or why not (kept), in words
    requantized: bool = False

    @property
    def runtime_divide(self) -> bool:
        return self.status in (PARTLY, KEPT_STATUS)

    def note(self) -> str | None:
        """The panel's "why not faster" text for a layer that still divides (None when nothing is left)."""
        if self.status == KEPT_STATUS:
            return f"SmoothQuant divide at run time: {self.where}"
        if self.status == PARTLY:
            return f"SmoothQuant: {self.where}"
        return None


@dataclasses.dataclass
class FoldReport:
    """Per smoothed linear, what was folded where or why not (for the loader's summary and the panel)."""

    mode: str
    layers: dict[str, LayerFold] = dataclasses.field(default_factory=dict)

    def add(self, name: str, status: str, where: str, requantized: bool = False) -> None:
        self.layers[name] = LayerFold(name, status, where, requantized)

    def by_status(self, *statuses: str) -> list[LayerFold]:
        return [f for f in self.layers.values() if f.status in statuses]

    def note(self, name: str) -> str | None:
        f = self.layers.get(name)
        return f.note() if f is not None else None

    def summary_lines(self) -> list[str]:
        """Lines for the loader's summary (empty when no layer carries a smoothing vector)."""
        if not self.layers:
            return []
        lines = []
        done = self.by_status(FOLDED_STATUS, ALREADY)
        if self.mode == "off":
            lines.append(
                f"SmoothQuant: folding off; every smoothed layer ({len(self.layers)}) divides its input at run time"
            )
        elif done:
            lines.append(f"SmoothQuant divide folded at load, none at run time: {len(done)} layers ({_groups(done)})")
        requant = [f for f in self.layers.values() if f.requantized]
        if requant:
            lines.append(
                f"  w1/w3 with different vectors: {len(requant)} weights re-quantized to one shared vector "
                f"(mode {self.mode!r}: {GATE_UP_MODES[self.mode]})"
            )
        part = self.by_status(PARTLY)
        if part:
            lines.append(
                f"SmoothQuant partly folded, a divide by a ratio left at run time: {len(part)} layers "
                f"({_groups(part, reasons=True)})"
            )
        kept = self.by_status(KEPT_STATUS) if self.mode != "off" else []
        if kept:
            lines.append(f"SmoothQuant divide kept at run time: {len(kept)} layers ({_groups(kept, reasons=True)})")
        return lines


def _local(name: str) -> str:
    return re.sub(r"^layers\.\d+\.", "", name)


def _groups(folds: list[LayerFold], reasons: bool = False) -> str:
    """'attention.qkv -> attention_norm1's weight x34, ...' (block index stripped, counted)."""
    counts: dict[tuple[str, str], int] = {}
    for f in folds:
        key = (_local(f.name), f.where)
        counts[key] = counts.get(key, 0) + 1
    parts = []
    for (local, where), n in counts.items():
        times = f" ×{n}" if n > 1 else ""
        parts.append(f"{local}{times}: {where}" if reasons else f"{local}{times} into {where}")
    return "; ".join(parts)


# -- the fold ------------------------------------------------------------------------------------------


def _is_int8(state, m: str) -> bool:
    w = state.get(f"{m}.weight")
    return w is not None and w.dtype == torch.int8


def _combine(mode: str, s1: torch.Tensor, s3: torch.Tensor) -> torch.Tensor:
    if mode == "geo":
        return torch.sqrt(s1 * s3)
    if mode == "max":
        return torch.maximum(s1, s3)
    if mode == "min":
        return torch.minimum(s1, s3)
    if mode == "w1":
        return s1.clone()
    raise ValueError(f"unknown gate/up mode {mode!r}")


REQUANT_CHUNK_ELEMENTS = 1 << 22  # float32 rows of at most 16 MiB per chunk (a GPU's)


def requantize_columns(q: torch.Tensor, ws: torch.Tensor, ratio: torch.Tensor):
    """int8 rows ``q`` (scales ``ws`` [N]) with every column k multiplied by ``ratio[k]``, re-quantized with as few
    new roundings as possible: a row whose values stay within ±127 keeps its scale, so its columns with ratio 1
    keep their int8 values bit for bit and the others are rounded once (half to even) on the same grid; a row that
    would overflow gets a new scale from its new absmax (every value rounded again). Returns (int8 [N, K],
    float32 [N])."""
    n, k = q.shape
    q2 = torch.empty_like(q)
    ws2 = ws.float().clone().reshape(n)
    # chunks of at most 1/32 of the rows: the float32 rows stay a small part of one int8 layer, so a load through
    # the fold holds at most one layer beyond the final model; on a CPU, rows that stay in the caches, worked in
    # place on one buffer (the arithmetic of quantize-on-load: formats/quantize_on_load.py says why)
    rows = max(1, min(n // 32, rows_per_chunk(k, q.device, 4 * REQUANT_CHUNK_ELEMENTS)))
    r = ratio.float().reshape(1, k).to(q.device)
    buf = torch.empty((min(rows, n), k), dtype=torch.float32, device=q.device)
    for a in range(0, n, rows):
        b = min(n, a + rows)
        v = buf[: b - a]
        v.copy_(q[a:b]).mul_(r)
        amax = row_absmax(v)
        over = amax > 127.0
        if bool(over.any()):
            inv = torch.where(over, 127.0 / amax.clamp_min(1e-30), torch.ones_like(amax))
            v.mul_(inv[:, None])
            ws2[a:b] = torch.where(over, ws2[a:b] * (amax / 127.0), ws2[a:b])
        q2[a:b].copy_(v.round_().clamp_(-127, 127))
    return q2, ws2


def _requantize(state, m: str, s_new: torch.Tensor, work_device) -> None:
    """<m>'s int8 weight W·diag(s_old) re-quantized as W·diag(s_new) (``requantize_columns``)."""
    q, ws, s_old = state[f"{m}.weight"], state[f"{m}.weight_scale"], state[f"{m}.{SMOOTH}"]
    home = q.device
    dev = torch.device(work_device) if work_device is not None else home
    ratio = s_new.to(dev).float() / s_old.to(dev).float()
    q2, ws2 = requantize_columns(q.to(dev), ws.to(dev), ratio)
    state[f"{m}.weight"] = q2.to(home)
    state[f"{m}.weight_scale"] = ws2.to(home)
    state[f"{m}.{SMOOTH}"] = s_new.to(device=s_old.device, dtype=torch.float32).clone()  # one tensor per key


def _divide_norm(state, norm: str, s: torch.Tensor) -> None:
    key = f"{norm}.weight"
    w = state[key]
    state[key] = (w.float() / s.to(w.device).float()).to(w.dtype)


def _divide_rows(state, producer: str, start: int, stop: int, s: torch.Tensor) -> None:
    key = f"{producer}.weight_scale"
    ws = state[key].float().reshape(-1).clone()
    ws[start:stop] = ws[start:stop] / s.to(ws.device).float()
    state[key] = ws


def _producer_blocker(state, site: FoldSite) -> str | None:
    """Why the per-channel scale at ``site`` cannot take a fold (None when it can)."""
    if site.kind == "norm":
        w = state.get(f"{site.producer}.weight")
        if w is None or not w.is_floating_point():
            return f"{site.producer}'s weight is not in the checkpoint"
        return None
    if not _is_int8(state, site.producer):
        return f"{site.producer} is stored as a float layer (no per-channel scale to fold into)"
    if f"{site.producer}.bias" in state:
        return f"{site.producer} has a bias (a fold would have to rescale it)"
    return None


def fold_smoothing(
    state: MutableMapping,
    config: Ideogram4Config,
    *,
    gate_up: str = DEFAULT_GATE_UP,
    work_device: torch.device | str | None = None,
) -> FoldReport:
    """Fold every foldable SmoothQuant divide of one branch's in-memory state into its producer, in place.

    ``state``: a ``read_branch`` result (or any dict in the in-memory form); entries are replaced by new tensors,
    never modified in place (a tensor shared with a caller stays as it was). ``gate_up``: a ``GATE_UP_MODES`` key,
    or "off" (nothing folded; the report still lists the smoothed layers). ``work_device``: where re-quantization
    runs (e.g. the GPU; default: where the weight is). Returns the FoldReport; a ``BranchStateDict`` also keeps it
    as ``state.smoothing``.
    """
    if gate_up != "off" and gate_up not in GATE_UP_MODES:
        raise ValueError(f"smoothing fold: gate_up={gate_up!r}; choose one of {[*GATE_UP_MODES, 'off']}")
    report = FoldReport(gate_up)
    sites = fold_sites(config)
    smoothed = [s.name for s in config.linears() if f"{s.name}.{SMOOTH}" in state and _is_int8(state, s.name)]
    for name in smoothed:
        if f"{name}.{FOLDED}" in state:
            f, s = state[f"{name}.{FOLDED}"], state[f"{name}.{SMOOTH}"]
            status = ALREADY if torch.equal(f, s) else PARTLY
            site = sites.get(name)
            where = f"{site.words} (folded before saving)" if site else "(folded before saving)"
            if status == PARTLY:
                where = "divides by the ratio of its vector to the one folded before saving"
            report.add(name, status, where)
    if gate_up == "off":
        for name in smoothed:
            report.layers.setdefault(name, LayerFold(name, KEPT_STATUS, "folding switched off"))
        _keep(state, report)
        return report

    todo = [n for n in smoothed if n not in report.layers]
    pairs = {}
    for name in todo:
        if name.endswith("feed_forward.w1") or name.endswith("feed_forward.w3"):
            pairs.setdefault(name.rsplit(".", 1)[0], []).append(name)
    # block order: norms / v rows first, then the gate/up pair (may re-quantize w3), then w2 (w3's rows)
    for name in todo:
        if name.endswith(("feed_forward.w1", "feed_forward.w3", "feed_forward.w2")):
            continue
        _fold_one(state, name, sites, report)
    for ff in pairs:
        _fold_gate_up(state, ff, sites, gate_up, work_device, report)
    for name in todo:
        if name.endswith("feed_forward.w2"):
            _fold_one(state, name, sites, report)
    _keep(state, report)
    return report


def _keep(state, report: FoldReport) -> None:
    if hasattr(state, "__dict__"):  # BranchStateDict: the loader's summary reads it from there
        state.smoothing = report


def _fold_one(state, name: str, sites: dict, report: FoldReport) -> None:
    site = sites.get(name)
    if site is None:
        report.add(name, KEPT_STATUS, kept_reason(name))
        return
    why = _producer_blocker(state, site)
    if why is not None:
        report.add(name, KEPT_STATUS, why)
        return
    s = state[f"{name}.{SMOOTH}"].float()
    if site.kind == "norm":
        _divide_norm(state, site.producer, s)
    else:
        _divide_rows(state, site.producer, site.start, site.stop, s)
    state[f"{name}.{FOLDED}"] = s.clone()
    report.add(name, FOLDED_STATUS, site.words)


def _fold_gate_up(state, ff: str, sites: dict, mode: str, work_device, report: FoldReport) -> None:
    w1, w3 = f"{ff}.w1", f"{ff}.w3"
    site = sites[w1]
    s1, s3 = state.get(f"{w1}.{SMOOTH}"), state.get(f"{w3}.{SMOOTH}")
    why = _producer_blocker(state, site)
    if why is None and (f"{w1}.{FOLDED}" in state or f"{w3}.{FOLDED}" in state):
        why = "its partner in the w1/w3 pair was folded before saving, it was not"
    if why is None and (s1 is None or s3 is None or not (_is_int8(state, w1) and _is_int8(state, w3))):
        why = "w1 and w3 (one norm feeds both) do not both carry a smoothing vector"
    if why is None and (f"{w1}.convrot_groupsize" in state or f"{w3}.convrot_groupsize" in state):
        if not torch.equal(s1, s3):
            why = "ConvRot weights with different smoothing vectors for w1 and w3"
    if why is not None:
        for m in (w1, w3):
            if f"{m}.{SMOOTH}" in state and _is_int8(state, m):
                report.add(m, KEPT_STATUS, why)
        return
    s1, s3 = s1.float(), s3.float()
    if torch.equal(s1, s3):
        shared, requant = s1, ()
        words = f"{site.words} (w1 and w3 carry the same vector)"
    elif mode == "ratio":
        _divide_norm(state, site.producer, s1)
        state[f"{w1}.{FOLDED}"] = s1.clone()
        state[f"{w3}.{FOLDED}"] = s1.clone()
        report.add(w1, FOLDED_STATUS, f"{site.words} (w1's vector)")
        report.add(
            w3,
            PARTLY,
            "ffn_norm1 carries w1's smoothing vector; w3 divides by the ratio of its own to it "
            "at run time (w1/w3 mode 'ratio')",
        )
        return
    else:
        shared = _combine(mode, s1, s3)
        requant = [m for m, s in ((w1, s1), (w3, s3)) if not torch.equal(s, shared)]
        words = f"{site.words} (one vector shared by w1 and w3)"
    for m in requant:
        _requantize(state, m, shared, work_device)
    _divide_norm(state, site.producer, shared)
    for m in (w1, w3):
        state[f"{m}.{FOLDED}"] = shared.clone()
        report.add(m, FOLDED_STATUS, words, requantized=m in requant)


# -- the inverse: LoRA on a folded model -------------------------------------------------------------
# After the fold a linear's int8 weight stores diag(1 / o)·W·diag(s) (s: input_smooth; o: output_folded, the rows a
# consumer's fold divided) and its input arrives as x / f (f: input_folded); a norm that took a fold stores
# weight / fold. A LoRA is trained on the real W and the real norm weight: these convert both ways, so the
# ComfyUI ops can let LoRA functions see the real weights while the stored ones stay folded.


def _like(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return v.to(device=w.device, dtype=w.dtype)


def stored_to_real(w: torch.Tensor, smooth: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
    """The stored (dequantized) weight -> the real W."""
    if smooth is not None:
        w = w / _like(smooth, w)
    if rows is not None:
        w = w * _like(rows, w).reshape(-1, 1)
    return w


def real_to_stored(w: torch.Tensor, smooth: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
    """The real W -> what the int8 weight stores."""
    if rows is not None:
        w = w / _like(rows, w).reshape(-1, 1)
    if smooth is not None:
        w = w * _like(smooth, w)
    return w


def real_to_input(w: torch.Tensor, folded: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor:
    """The real W -> the float weight for the module's input x / f, output rows still folded:
    F.linear(x / f, W·diag(f)) = F.linear(x, W)."""
    if folded is not None:
        w = w * _like(folded, w)
    if rows is not None:
        w = w / _like(rows, w).reshape(-1, 1)
    return w


def unfold_norm(w: torch.Tensor, fold: torch.Tensor) -> torch.Tensor:
    """A folded norm's stored weight -> the real one."""
    return w * _like(fold, w)


def refold_norm(w: torch.Tensor, fold: torch.Tensor) -> torch.Tensor:
    """A norm's real weight -> what it stores after the fold."""
    return w / _like(fold, w)


def linked_folds(config: Ideogram4Config, folded: Mapping[str, torch.Tensor | None]):
    """(FoldSite, f) for every fold site whose consumer carries ``input_folded`` f (``folded``: by linear name),
    f as float32 on the CPU: what the producer (a norm's weight, a linear's output rows) was divided by."""
    for consumer, site in fold_sites(config).items():
        f = folded.get(consumer)
        if f is not None:
            yield site, f.detach().float().cpu()


def folded_rows(rows: torch.Tensor | None, n: int, site: FoldSite, f: torch.Tensor) -> torch.Tensor:
    """A producer linear's ``output_folded`` [n] (ones where no fold divided its rows) with ``site``'s fold set."""
    rows = torch.ones(n, dtype=torch.float32) if rows is None else rows.clone()
    rows[site.start : site.stop] = f
    return rows


__all__ = [
    "fold_smoothing",
    "fold_sites",
    "FoldSite",
    "FoldReport",
    "LayerFold",
    "runtime_divisor",
    "GATE_UP_MODES",
    "DEFAULT_GATE_UP",
    "KEPT",
    "kept_reason",
    "stored_to_real",
    "real_to_stored",
    "real_to_input",
    "unfold_norm",
    "refold_norm",
    "linked_folds",
    "folded_rows",
]
