"""What the loader node reads, and the summary it shows afterwards (ComfyUI-free).

``plan_branches`` decides, from the file headers only, which file (and which base) each of the
two CFG branches comes from:

* a two-branch file (the transformerlab W8A8 ``ideogram4-int8-w8a8.safetensors``) gives both;
* a single-branch file (ComfyUI's ``ideogram4_fp8_scaled`` / ``ideogram4_int8_convrot`` / a bf16
  file, or this pack's own single-branch form) is the conditional branch, and the unconditional
  branch needs its own file (``ideogram4_unconditional_...``);
* an explicitly chosen unconditional file always wins over the second branch of a two-branch file.

``format_summary`` turns what was loaded into the loader's summary text: layers per GEMM path,
the bf16-protected layers and why, what came from the base, what was quantized on load.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterable, Mapping

from ..kernels.fp8_gemm import FLOAT_REASON as FP8_FLOAT_REASON
from ..kernels.path_choice import labels_here
from .errors import PICK_IDEOGRAM4, CheckpointError
from .formats.detect import detect_format

BRANCHES = ("conditional", "unconditional")
FORMAT_NAMES = {
    "transformerlab-w8a8": "W8A8 (transformerlab, int8 weights + per-token int8 activations)",
    "comfy-int8-convrot": "ComfyUI int8_tensorwise + ConvRot",
    "comfy-int8": "ComfyUI int8_tensorwise",
    "comfy-fp8": "ComfyUI fp8_scaled (quantized to W8A8 on load)",
    "comfy-fp8-legacy": "ComfyUI legacy scaled_fp8 (quantized to W8A8 on load)",
}


@dataclasses.dataclass(frozen=True)
class BranchSource:
    """One branch to load: ``read_branch(path, branch, base)``."""

    branch: str
    path: pathlib.Path
    base: pathlib.Path | None
    format: str
    note: str = ""

    def describe(self) -> str:
        fmt = FORMAT_NAMES.get(self.format, self.format)
        text = f"{self.path.name} [{fmt}]"
        if self.base is not None:
            text += f" + base {self.base.name}"
        return text + (f" ({self.note})" if self.note else "")


def _format_of(path: pathlib.Path, role: str) -> dict:
    if not path.is_file():
        raise CheckpointError(
            f"the {role} file does not exist",
            file=path,
            fix="pick a file from the list (refresh the page after copying files)",
        )
    info = detect_format(path)
    if info["format"] == "unknown":
        raise CheckpointError(
            f"the {role} file is not an Ideogram 4 diffusion model: it holds no Ideogram 4 DiT linears",
            file=path,
            expected="an Ideogram 4 diffusion model (W8A8, int8, fp8 or bf16)",
            found=f"{len(info.get('linears', {}))} linear layers",
            fix=PICK_IDEOGRAM4,
        )
    from .checkpoint import check_architecture

    check_architecture(path, info["branches"][0] if info["branches"] else "conditional")
    return info


def plan_branches(
    weights: str | os.PathLike,
    unconditional: str | os.PathLike | None = None,
    base: str | os.PathLike | None = None,
    unconditional_base: str | os.PathLike | None = None,
) -> list[BranchSource]:
    """[conditional, unconditional] sources, checked from the headers (nothing is loaded).

    Raises CheckpointError naming the file and what to pick instead.
    """
    main = pathlib.Path(weights)
    info = _format_of(main, "weights")
    uncond = pathlib.Path(unconditional) if unconditional else None
    uinfo = _format_of(uncond, "unconditional weights") if uncond is not None else None
    base_p = pathlib.Path(base) if base else None
    ubase_p = pathlib.Path(unconditional_base) if unconditional_base else None
    for p, role in ((base_p, "base"), (ubase_p, "unconditional base")):
        if p is not None and not p.is_file():
            raise CheckpointError(f"the {role} file does not exist", file=p, fix="pick a file from the list")

    if info["layout"] == "two-branch":
        if "conditional" not in info["branches"]:
            raise CheckpointError(
                "this two-branch file has no conditional branch",
                file=main,
                key="conditional.*",
                fix="pick the file that holds the conditional weights",
            )
        cond = BranchSource("conditional", main, base_p, info["format"])
    else:
        cond = BranchSource("conditional", main, base_p, info["format"], "single-branch file: conditional")

    # the unconditional branch's base: its own, else a two-branch base serves both branches
    def uncond_base(default_ok: bool) -> pathlib.Path | None:
        if ubase_p is not None:
            return ubase_p
        if base_p is not None and default_ok and detect_format(base_p)["layout"] == "two-branch":
            return base_p
        return None

    if uncond is not None:
        if uinfo["layout"] == "two-branch" and "unconditional" not in uinfo["branches"]:
            raise CheckpointError(
                "this two-branch file has no unconditional branch",
                file=uncond,
                key="unconditional.*",
                fix="pick the file with the unconditional weights",
            )
        note = "chosen as unconditional weights"
        if info["layout"] == "two-branch" and "unconditional" in info["branches"]:
            note += f"; overrides the unconditional branch of {main.name}"
        u = BranchSource("unconditional", uncond, uncond_base(True), uinfo["format"], note)
    elif info["layout"] == "two-branch" and "unconditional" in info["branches"]:
        u = BranchSource("unconditional", main, uncond_base(True), info["format"])
    else:
        raise CheckpointError(
            "this file holds one branch only; Ideogram 4's CFG runs a second, unconditional copy of the model",
            file=main,
            key="unconditional_weights",
            fix="pick the matching unconditional file in 'unconditional_weights' (e.g. "
            "ideogram4_unconditional_fp8_scaled.safetensors next to ideogram4_fp8_scaled.safetensors)",
        )
    return [cond, u]


# -- host memory -----------------------------------------------------------------------------------

# Bytes a loaded branch holds in host memory per linear parameter, measured on a full-size W8A8 branch (int8
# weights, 17 protected bf16 w2, bf16 norms and embeddings; docs/design/measurements.md); a quantized-on-load
# bf16/fp8 branch holds less.
HOST_BYTES_PER_LINEAR_PARAMETER = 1.11
HOST_HEADROOM = 1 << 30  # bytes left for ComfyUI, the text encoder's and VAE's host copies, Python


def host_bytes_of(config) -> int:
    """Host memory one loaded branch of architecture ``config`` holds."""
    return int(config.linear_parameter_count() * HOST_BYTES_PER_LINEAR_PARAMETER)


def host_bytes_needed(sources: Iterable[BranchSource]) -> int:
    """Host memory the loaded branches hold together (each built in host memory before ComfyUI moves or streams it
    to the card, and kept there while it streams)."""
    from .checkpoint import check_architecture

    return sum(host_bytes_of(check_architecture(src.path, src.branch)) for src in sources)


LOAD_RAM_WHY = (
    "to load both branches: their weights live in host memory while ComfyUI moves them to the card or streams them "
    "from there"
)
FREE_SOME_RAM = "close other programs or unload models ComfyUI keeps in memory, then queue again"
LOAD_RAM_FIX = f"{FREE_SOME_RAM}; a machine with 32 GB of RAM holds the full Ideogram 4 at INT8"


def check_host_memory(needed: int, available: int, why: str = LOAD_RAM_WHY, fix: str = LOAD_RAM_FIX) -> None:
    """A clear error before loading when the branches cannot fit the system memory (not the OS's out-of-memory kill
    halfway through). ``available``: free RAM plus free swap; ``why`` / ``fix``: what needs the memory and what to do
    (the loader's by default)."""
    if needed + HOST_HEADROOM <= available:
        return
    gb = 1e9
    raise CheckpointError(
        f"not enough free system memory (RAM) {why}",
        expected=f"at least {(needed + HOST_HEADROOM) / gb:.1f} GB free",
        found=f"{available / gb:.1f} GB free (RAM + swap)",
        fix=fix,
    )


# -- summary ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class BranchReport:
    """What was loaded for one branch (filled by the node after building the model)."""

    label: str
    source: str
    compute_dtype: str
    paths: dict[str, tuple[str, str]]  # linear name -> (GEMM path, reason)
    protected: list[str] = dataclasses.field(default_factory=list)
    protected_fp8: list[str] = dataclasses.field(default_factory=list)  # protected layers stored float8 e4m3
    top_float: list[str] = dataclasses.field(default_factory=list)
    quantized_on_load: list[str] = dataclasses.field(default_factory=list)
    int8_stored: int = 0
    from_base: list[str] = dataclasses.field(default_factory=list)
    smooth: int = 0
    convrot: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    load_seconds: float | None = None  # reading the branch's layers, quantize-on-load included

    def path_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for path, _ in self.paths.values():
            counts[path] = counts.get(path, 0) + 1
        return counts


def _names(names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names, key=_natural)
    head = ", ".join(names[:limit])
    return head + (f", … (+{len(names) - limit})" if len(names) > limit else "")


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in name.replace(".", " . ").split()]


def format_summary(reports: Iterable[BranchReport], extra: Iterable[str] = ()) -> str:
    """The loader's summary (its ``summary`` output and the server log). Paths are named as the GEMM-path panel names
    them on this device, with the path id in brackets (the id IDEOGRAM4_INT8_GEMM_PATH and the widgets take)."""
    _, labels = labels_here()

    def named(path: str) -> str:
        return f"{labels.get(path, path)} [{path}]"

    lines = []
    for r in reports:
        counts = r.path_counts()
        lines.append(f"{r.label}: {r.source}")
        lines.append(
            f"  compute dtype {r.compute_dtype}; GEMM paths: "
            + ", ".join(f"{n} on {named(p)}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        )
        if r.protected:
            lines.append(f"  bf16-protected layers ({len(r.protected)}): {_names(r.protected)}")
        if r.protected_fp8:
            lines.append(f"  protected layers stored fp8 e4m3 ({len(r.protected_fp8)}): {_names(r.protected_fp8)}")
        if r.top_float:
            lines.append(f"  float top-level layers ({len(r.top_float)}): {_names(r.top_float)}")
        if r.int8_stored:
            lines.append(f"  int8 layers used as stored: {r.int8_stored}")
        if r.quantized_on_load:
            took = f" (the branch read in {r.load_seconds:.1f} s)" if r.load_seconds is not None else ""
            lines.append(f"  quantized to W8A8 on load: {len(r.quantized_on_load)} layers{took}")
        if r.smooth or r.convrot:
            lines.append(f"  SmoothQuant-smoothed layers: {r.smooth}; ConvRot layers: {r.convrot}")
        if r.from_base:
            lines.append(f"  from the base checkpoint: {len(r.from_base)} tensors ({_names(r.from_base, 4)})")
        reasons: dict[tuple[str, str], int] = {}
        for path, why in r.paths.values():
            # a bf16 layer's reason is why it is float, except a layer stored fp8 that runs float here (say why)
            if why and (path != "bf16" or why.startswith(FP8_FLOAT_REASON)):
                reasons[(path, why)] = reasons.get((path, why), 0) + 1
        for (path, why), n in sorted(reasons.items()):
            lines.append(f"  why not faster ({n} layers on {named(path)}): {why}")
        lines.extend(f"  {n}" for n in r.notes)
    lines.extend(extra)
    return "\n".join(lines)


def branch_report(
    label: str, source: str, compute_dtype: str, paths: Mapping[str, tuple[str, str]], state, config
) -> BranchReport:
    """A BranchReport from a ``read_branch`` result (``state``: its ``.layers``/``.from_base``) and the paths."""
    from .comfy_form import linear_infos

    infos = linear_infos(state, config)
    layers = getattr(state, "layers", {}) or {}
    rep = BranchReport(label, source, compute_dtype, dict(paths))
    for info in infos:
        if info.fp8:
            rep.protected_fp8.append(info.name)
        elif not info.int8:
            (rep.top_float if info.top_level else rep.protected).append(info.name)
        rep.smooth += info.smooth
        rep.convrot += info.convrot is not None
        if "quantized on load" in layers.get(info.name, ""):
            rep.quantized_on_load.append(info.name)
        elif info.int8:
            rep.int8_stored += 1
    rep.from_base = list(getattr(state, "from_base", []) or [])
    rep.load_seconds = getattr(state, "load_seconds", None)
    smoothing = getattr(state, "smoothing", None)  # smooth_fold.FoldReport, set when the model was built
    if smoothing is not None:
        rep.notes.extend(smoothing.summary_lines())
    return rep


__all__ = [
    "BranchSource",
    "plan_branches",
    "host_bytes_of",
    "host_bytes_needed",
    "check_host_memory",
    "BranchReport",
    "branch_report",
    "format_summary",
    "BRANCHES",
]
