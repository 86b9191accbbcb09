"""``read_branch``: one CFG branch of an Ideogram 4 checkpoint, in official key names.

Sources it reads (safetensors only, opened lazily, streamed tensor by tensor):
  * the transformerlab W8A8 file (both branches, ``conditional.`` / ``unconditional.`` prefixes);
  * ComfyUI's per-branch files: ``int8_tensorwise`` (+ ConvRot) and ``fp8_scaled`` comfy_quant
    layers, legacy ``scaled_fp8`` files, plain bf16 / fp16 / fp32 files;
  * a base checkpoint (any of the above, or a dict) for tensors the main file lacks.

Output: a dict (``BranchStateDict``) where each quantized linear ``<m>`` is

    <m>.weight int8 [N, K], <m>.weight_scale float32 [N], [<m>.input_smooth float32 [K]],
    [<m>.bias], [<m>.convrot_groupsize int64 [] (ComfyUI ConvRot weights)]

(plus ``<m>.input_folded`` [K] only when the source is this pack's own form saved after the smoothing fold:
``smooth_fold``; read_branch never folds anything itself)

and every other tensor (float linears, norms, the indicator embedding) is a float tensor in
``dtype``. Everything is checked from the headers before any tensor data is read; a failed load
returns nothing and drops whatever it had loaded.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
import traceback
from collections.abc import Callable, Iterable

import torch

from .config import Ideogram4Config, infer_config
from .errors import (
    PICK_IDEOGRAM4,
    BaseMismatchError,
    CheckpointError,
    DeviceUnavailableError,
    MissingKeysError,
    TensorMismatchError,
    few,
)
from .formats.linear_plan import FLOAT_DTYPES, FP8_DTYPES, LinearPlan, check_float, classify, classify_bias
from .formats.quantize_on_load import NonFiniteWeightError, dequantize_fp8, quantize_fp8_tensorwise, quantize_weight
from .formats.source import Source, open_source
from .w8a8_module import name_filter

CONFIG_METADATA_KEY = "ideogram4_config"
Progress = Callable[[int, int, str], None]


class BranchStateDict(dict):
    """A plain ``dict[str, Tensor]`` plus what the loader learned on the way.

    Attributes:
        config: the architecture (``Ideogram4DiT.from_state_dict`` uses it).
        file, branch: where it came from.
        layers: ``{linear name: one-line description of its storage}`` (for logs / the panel).
        from_base: keys taken from the base checkpoint.
        ignored: file keys not used (only with strict=False).
        load_seconds: wall time of reading and converting the layers (quantize-on-load included).
    """

    config: Ideogram4Config | None = None
    file: str | None = None
    branch: str | None = None
    layers: dict[str, str]
    load_seconds: float | None = None
    from_base: list[str]
    ignored: list[str]

    def quantized_layers(self) -> list[str]:
        return sorted(k[: -len(".weight")] for k, v in self.items() if k.endswith(".weight") and v.dtype == torch.int8)


def _check_device(device, path) -> torch.device:
    """torch.device(device), or a DeviceUnavailableError saying why the tensors cannot go there."""
    label = "<state dict>" if isinstance(path, dict) else path
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceUnavailableError(
            f"device={device!r} is not a torch device ({exc})",
            file=label,
            fix="pass device='cpu' or 'cuda' (or 'cuda:N')",
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device={device!r} asked for, but torch {torch.__version__} sees no CUDA GPU "
                "(a CPU-only torch build, or no GPU / driver)",
                file=label,
                fix="read on the CPU with device='cpu', or use a machine with an NVIDIA GPU and a CUDA build of torch",
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceUnavailableError(
                f"device={device!r} asked for, but this machine has {count} CUDA device(s)",
                file=label,
                fix=f"use cuda:0 .. cuda:{count - 1}",
            )
    return dev


def read_branch(
    path: str | os.PathLike | dict,
    branch: str,
    base: str | os.PathLike | dict | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    quantize: bool | Iterable[str] | Callable[[str], bool] | None = None,
    float_blocks_fp8: bool = False,
    config: Ideogram4Config | None = None,
    strict: bool = True,
    progress: Progress | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> BranchStateDict:
    """Read one branch (``"conditional"`` / ``"unconditional"``) into the in-memory W8A8 form.

    Args:
        path: a .safetensors file, or ``hf://<owner>/<repo>/<file>`` to download it from the
            Hugging Face hub (token from HF_TOKEN or ``hf auth login``; HF_HUB_OFFLINE respected),
            or a dict of tensors in any of the accepted layouts (e.g. a native ComfyUI model's
            ``state_dict()``; its tensors are used as they are where no conversion is needed).
        branch: which CFG branch. Two-branch files must contain it; single-branch files are
            taken as that branch.
        base: checkpoint (path, hf:// URL or dict) for tensors ``path`` lacks: norms, the
            embedding, unquantized top-level linears. Never overrides what ``path`` has.
        device: where the tensors go (quantize-on-load runs there, a layer at a time).
        dtype: dtype of every float tensor (norms, float linears, biases).
        quantize: which float / fp8 linears to quantize to W8A8 on load. None (default): when
            ``path`` holds no int8 layer at all (a bf16 / fp8 file), the block linears and
            llm_cond_proj (``Ideogram4Config.default_quantized``); otherwise none — layers a W8A8
            file stores as bf16 are protected on purpose. True / False / names / predicate.
        float_blocks_fp8: the block linears that stay float (a W8A8 file's protected layers; fp8 / bf16 layers
            ``quantize`` leaves out) are stored as float8 e4m3 with one scale per tensor (ComfyUI's
            ``float8_e4m3fn`` form; an e4m3 layer with one scale keeps its codes), for the ``triton-fp8`` path.
        config: the architecture; default: the file's metadata, else inferred from the shapes.
        strict: refuse tensors the architecture does not use (else they are listed in ``.ignored``).
        progress: ``progress(done, total, name)`` after each layer / tensor (ComfyUI progress bar).
        revision, cache_dir: for hf:// paths.

    Raises:
        CheckpointError (a ValueError) naming the file, the key, expected vs found, and the fix.
    """
    from .hub import resolve

    device = _check_device(device, path)
    if not isinstance(path, dict):
        path = resolve(path, revision=revision, cache_dir=cache_dir)
    if base is not None and not isinstance(base, dict):
        base = resolve(base, revision=revision, cache_dir=cache_dir)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"read_branch: dtype must be one of {FLOAT_DTYPES}; got {dtype}")
    main = open_source(path, branch)
    base_src = open_source(base, branch, role="base") if base is not None else None
    with main.opened(device), base_src.opened(device) if base_src else _null():
        plan = _plan(main, base_src, config, quantize, strict, float_blocks_fp8)
        out = BranchStateDict()
        out.config, out.file, out.branch = plan.config, main.label if isinstance(path, dict) else str(path), branch
        out.layers = {p.name: p.describe() for p in plan.linears}
        out.from_base = plan.from_base
        out.ignored = plan.ignored
        started = time.perf_counter()
        try:
            _load(plan, out, device, dtype, progress)
        except BaseException as exc:
            out.clear()  # no half-built branch survives ...
            traceback.clear_frames(exc.__traceback__)  # ... nor a tensor held by a finished frame's locals
            raise
        out.load_seconds = time.perf_counter() - started
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@dataclasses.dataclass
class _Plan:
    config: Ideogram4Config
    linears: list[LinearPlan]
    others: list[tuple[str, Source]]
    from_base: list[str]
    ignored: list[str]


def _config_for(main: Source, base: Source | None, config: Ideogram4Config | None) -> Ideogram4Config:
    if config is not None:
        return config
    meta = main.metadata.get(CONFIG_METADATA_KEY) or (base.metadata.get(CONFIG_METADATA_KEY) if base else None)
    if meta:
        try:
            return Ideogram4Config.from_json(meta)
        except (ValueError, TypeError) as exc:
            raise CheckpointError(
                f"metadata {CONFIG_METADATA_KEY!r} is not a valid config ({exc})", file=main.label, key="__metadata__"
            ) from None
    shapes = _linear_shapes(main)
    if base is not None:
        for k, v in _linear_shapes(base).items():
            shapes.setdefault(k, v)
    try:
        return infer_config(shapes)
    except ValueError as exc:
        raise CheckpointError(
            f"this is not an Ideogram 4 diffusion model: its tensors do not have Ideogram 4's layout ({exc})",
            file=main.label,
            fix=PICK_IDEOGRAM4,
        ) from None


def check_architecture(path: str | os.PathLike, branch: str = "conditional") -> Ideogram4Config:
    """The Ideogram 4 config of one branch of a file, from its header alone (nothing is loaded).

    Raises CheckpointError when the file is not an Ideogram 4 diffusion model (e.g. another DiT with 'layers.N.'
    keys), so a loader can say so before it asks for a second branch or a base."""
    return _config_for(open_source(path, branch), None, None)


def _linear_shapes(src: Source) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for key, (_, shape) in src.entries.items():
        if key.endswith(".wq"):
            shapes[key[:-3] + ".weight"] = shape
        else:
            shapes[key] = shape
    return shapes


def _base_mismatch(exc: TensorMismatchError) -> BaseMismatchError:
    """A tensor of the base checkpoint does not fit: the same problem, told as the base's."""
    return BaseMismatchError(
        exc.problem,
        file=exc.file,
        key=exc.key,
        expected=exc.expected,
        found=exc.found,
        fix="pass the matching official checkpoint as base",
    )


def _other_architecture(main: Source, base: Source, field: str, expected, found) -> BaseMismatchError:
    return BaseMismatchError(
        "the base checkpoint belongs to a different architecture",
        file=base.label,
        key=field,
        expected=f"{field} = {expected} (as in {main.label})",
        found=f"{field} = {found}",
        fix="pass the official Ideogram 4 checkpoint of the same branch as base",
    )


def _check_base_matches(main: Source, base: Source, config: Ideogram4Config) -> None:
    """A base from another architecture (other depth / width) is refused before anything loads."""
    depth = {int(k.split(".")[1]) for k in base.entries if k.startswith("layers.") and k.split(".")[1].isdigit()}
    if depth and max(depth) + 1 != config.num_layers:
        raise _other_architecture(main, base, "num_layers", config.num_layers, max(depth) + 1)
    try:
        base_cfg = infer_config(_linear_shapes(base), config)
    except ValueError:
        return  # a base holding only norms / embeddings: its shapes are checked key by key
    for field in ("num_layers", "num_heads", "head_dim", "intermediate_size", "adaln_dim"):
        a, b = getattr(config, field), getattr(base_cfg, field)
        if a != b:
            raise _other_architecture(main, base, field, a, b)


def _has_int8(src: Source) -> bool:
    return any(k.endswith(".wq") or (k.endswith(".weight") and dt == torch.int8) for k, (dt, _) in src.entries.items())


def _resolve_quantize(quantize, main: Source, config: Ideogram4Config):
    if quantize is None:
        return name_filter(() if _has_int8(main) else config.default_quantized())
    if not (isinstance(quantize, bool) or callable(quantize)):
        quantize = frozenset(quantize)
        unknown = quantize - set(config.linear_names())
        if unknown:
            raise ValueError(f"read_branch: quantize names {few(unknown)} are not linears of this architecture")
    return name_filter(quantize)


def _plan(main: Source, base: Source | None, config, quantize, strict, float_blocks_fp8=False) -> _Plan:
    config = _config_for(main, base, config)
    if base is not None:
        _check_base_matches(main, base, config)
    should_quantize = _resolve_quantize(quantize, main, config)
    main_has_int8 = _has_int8(main)
    linears, others, from_base, missing = [], [], [], []
    for spec in config.linears():
        plan = classify(main, spec)
        if plan is None and base is not None:
            try:
                plan = classify(base, spec)
            except TensorMismatchError as exc:
                raise _base_mismatch(exc) from None
            if plan is not None:
                from_base.append(spec.name + ".weight")
        if plan is None:
            missing.append(f"{spec.name}.weight")
        bias_src = None
        if classify_bias(main, spec) is not None:
            bias_src = main
        elif base is not None and _base_bias(base, spec) is not None:
            bias_src = base
            from_base.append(spec.name + ".bias")
        elif spec.bias:
            missing.append(f"{spec.name}.bias")
        if plan is None:
            continue
        plan.bias_source = bias_src
        if plan.kind in ("fp8", "float"):
            plan.quantize = bool(should_quantize(spec.name))
            plan.fp8 = float_blocks_fp8 and not plan.quantize and spec.name.startswith("layers.")
            if not plan.quantize and plan.source is main and main_has_int8 and spec.name.startswith("layers."):
                plan.notes.append("protected in checkpoint (" + ("stored fp8 on load)" if plan.fp8 else "kept float)"))
        linears.append(plan)
    for key, shape in config.other_shapes().items():
        src = main if main.has(key) else (base if base is not None and base.has(key) else None)
        if src is None:
            missing.append(key)
            continue
        if src is base:
            from_base.append(key)
        src.use(key)
        try:
            _check_other(src, key, shape)
        except TensorMismatchError as exc:
            if src is base:
                raise _base_mismatch(exc) from None
            raise
        others.append((key, src))
    if missing:
        if base is None:
            fix = (
                "pass base= the official Ideogram 4 checkpoint of this branch (it supplies norms, embeddings "
                "and unquantized layers)"
            )
        else:
            fix = "the base checkpoint lacks them too: check both files"
        raise MissingKeysError(
            f"{len(missing)} tensors the architecture needs are missing",
            file=main.label,
            key=missing[0],
            expected=f"{len(config.float_shapes())} tensors of a {config.num_layers}-block Ideogram 4 branch",
            found=f"missing {few(missing)}",
            fix=fix,
        )
    unused = main.unused()
    if unused and strict:
        raise TensorMismatchError(
            f"{len(unused)} tensors are not part of the Ideogram 4 architecture",
            file=main.label,
            key=main.file_key(unused[0]),
            expected="only Ideogram 4 DiT tensors",
            found=few(unused),
            fix="check that this is an Ideogram 4 checkpoint; pass strict=False to ignore extra tensors",
        )
    return _Plan(config, linears, others, from_base, unused)


def _base_bias(base: Source, spec):
    try:
        return classify_bias(base, spec)
    except TensorMismatchError as exc:
        raise _base_mismatch(exc) from None


def _check_other(src: Source, key: str, shape: tuple) -> None:
    dt = src.dtype(key)
    if dt in FP8_DTYPES:
        if tuple(src.shape(key)) != tuple(shape):
            check_float(src, key, shape, "tensor")  # raises with the shape message
        return
    check_float(src, key, shape, "tensor")


# -- loading -----------------------------------------------------------------------------------


def _load(plan: _Plan, out: dict, device, dtype, progress) -> None:
    total = len(plan.linears) + len(plan.others)
    done = 0
    for lp in plan.linears:
        _load_linear(lp, out, device, dtype)
        done += 1
        if progress is not None:
            progress(done, total, lp.name)
    for key, src in plan.others:
        t = src.load(key, device)
        out[key] = _to(t, device, dtype)
        done += 1
        if progress is not None:
            progress(done, total, key)


def _to(t: torch.Tensor, device, dtype) -> torch.Tensor:
    if t.device != device or t.dtype != dtype:
        t = t.to(device=device, dtype=dtype)
    return t


def _finite_positive(t: torch.Tensor, lp: LinearPlan, key: str, what: str, allow_zero: bool) -> None:
    bad = ~torch.isfinite(t) | ((t < 0) if allow_zero else (t <= 0))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0]) if t.dim() else 0
        raise TensorMismatchError(
            f"{what} holds invalid values",
            file=lp.source.label,
            key=lp.source.file_key(key),
            expected="finite values > 0" if not allow_zero else "finite values >= 0",
            found=f"{t.reshape(-1)[i].item()} at index {i}",
            fix="the file is damaged or was written by a broken tool",
        )


def _load_linear(lp: LinearPlan, out: dict, device, dtype) -> None:
    m, n = lp.name, lp.spec.out_features
    src = lp.source
    if lp.kind in ("w8a8", "int8"):
        w = src.load(lp.weight, device)
        scale = src.load(lp.scale, device).float().reshape(-1)
        if scale.numel() == 1:
            scale = scale.expand(n).contiguous()
        _finite_positive(scale, lp, lp.scale, "weight scale", allow_zero=True)
        out[f"{m}.weight"] = w.to(device) if w.is_contiguous() else w.to(device).contiguous()
        out[f"{m}.weight_scale"] = scale.to(device)
        if lp.smooth is not None:
            smooth = src.load(lp.smooth, device).float().reshape(-1).to(device)
            _finite_positive(smooth, lp, lp.smooth, "SmoothQuant vector", allow_zero=False)
            out[f"{m}.input_smooth"] = smooth
        if lp.folded is not None:  # this pack's own form, saved after the smoothing fold (smooth_fold)
            folded = src.load(lp.folded, device).float().reshape(-1).to(device)
            _finite_positive(folded, lp, lp.folded, "folded SmoothQuant vector", allow_zero=False)
            out[f"{m}.input_folded"] = folded
        if lp.group is not None:
            out[f"{m}.convrot_groupsize"] = torch.tensor(lp.group, dtype=torch.int64)
    else:
        w = src.load(lp.weight, device).to(device)
        scale = src.load(lp.scale, device).to(device) if lp.scale is not None else None
        if scale is not None:
            _finite_positive(scale.float(), lp, lp.scale, "fp8 weight scale", allow_zero=True)
        try:
            if lp.quantize:
                out[f"{m}.weight"], out[f"{m}.weight_scale"] = quantize_weight(w, scale)
            elif lp.fp8:
                out[f"{m}.weight"], out[f"{m}.weight_scale"] = quantize_fp8_tensorwise(w, scale)
            elif lp.kind == "fp8":
                out[f"{m}.weight"] = dequantize_fp8(w, scale, dtype)
            else:
                out[f"{m}.weight"] = _to(w, device, dtype)
        except NonFiniteWeightError as exc:
            what = (
                "quantize this layer"
                if lp.quantize
                else ("store this layer in fp8" if lp.fp8 else "widen this fp8 layer")
            )
            raise TensorMismatchError(
                f"cannot {what}: {exc}",
                file=src.label,
                key=src.file_key(lp.weight),
                fix="the file is damaged or was written by a broken tool",
            ) from None
        del w
    if lp.bias_source is not None:
        out[f"{m}.bias"] = _to(lp.bias_source.load(f"{m}.bias", device), device, dtype)


def write_branch_form(
    path: str | os.PathLike,
    state: dict[str, torch.Tensor],
    config: Ideogram4Config | None = None,
) -> pathlib.Path:
    """Save a read_branch result as it is (this pack's own single-branch form; readable again)."""
    from .safetensors_io import save_tensors

    config = config or getattr(state, "config", None)
    meta = {CONFIG_METADATA_KEY: config.to_json()} if config is not None else {}
    return save_tensors(path, dict(state), meta)


__all__ = ["read_branch", "BranchStateDict", "write_branch_form", "CONFIG_METADATA_KEY"]
