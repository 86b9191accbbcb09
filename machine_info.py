"""What this machine gets from the pack: versions, the GEMM path of an Ideogram 4 linear and why, the kernel
family, the fp8 path of the protected layers, the attention path and the kernels' self-check. ``python -m
comfyui_ideogram4_int8 info`` prints it and the GEMM benchmark stores it with its results; torch and the kernels are
imported only when a report is asked for, so the command line's ``--help`` stays instant."""

from __future__ import annotations

# an Ideogram 4 linear (attention.qkv: N = 13824, K = 4608) for `info`'s path question
INFO_SHAPE = (13824, 4608)
# an Ideogram 4 attention at 1024x1024 (tokens, heads, head dim) for `info`'s attention question
INFO_ATTENTION = (4608, 18, 256)


def info_report() -> dict:
    """What this machine gets: versions, the GEMM path of an Ideogram 4 linear on its default device and why,
    and, on the fused path, which kernel family runs it."""
    import torch

    from . import __version__
    from .kernels import backends, environment_report, select_path
    from .kernels.launch import status as launch_status
    from .kernels.path_choice import dequant_dtype
    from .kernels.registry import path_labels

    report = {"version": __version__, **environment_report()}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n, k = INFO_SHAPE
    path, why_not_faster = select_path(device, n, k)
    # the dequantized matmul's dtype: bf16 on a GPU; on a CPU what it measured fast (float32 unless bf16 is faster)
    dtype = "bfloat16" if device.type == "cuda" else str(dequant_dtype(torch.empty(0, dtype=torch.bfloat16)))
    dtype = dtype.replace("torch.", "")
    report.update(
        device=str(device),
        gemm_path=path,
        gemm_path_reason=why_not_faster or "the fastest path",
        fused_kernel_unavailable=backends.unavailable("triton", device),
    )
    report.update(cached_launches=launch_status(), demoted=backends.DEMOTIONS.items())
    if path == "triton-int8":
        gluon_why = backends.unavailable("gluon", device)
        if gluon_why is None:
            report.update(
                backend="gluon",
                backend_reason="Hopper: warp-specialized Gluon kernels (wgmma + TMA) "
                "where the tuned table picks them, the portable Triton kernel elsewhere",
            )
        else:
            report.update(
                backend="triton", backend_reason=f"portable Triton kernel (Gluon kernels not used: {gluon_why})"
            )
    elif path == "cublas-int8":
        report.update(
            backend="torch._int_mm",
            backend_reason="int8 GEMM by torch._int_mm "
            f"({'cuBLASLt' if device.type == 'cuda' else 'CPU'}), dequantization as a separate step",
        )
    else:
        report.update(backend="float matmul", backend_reason=f"int8 operands dequantized to {dtype}, then a float GEMM")
    report["path_label"] = path_labels(device.type, dtype)[path]  # what the path id runs on this device
    from .kernels.fp8_gemm import select_fp8_path

    fp8_path, fp8_why = select_fp8_path(device)  # the loader's protected_layers = fp8
    report["fp8_protected_path"] = fp8_path
    report["fp8_protected_reason"] = fp8_why or "fused FP8 GEMM"
    report.update(_family_report(device, report["arch"]))
    report["attention"] = _attention_report(device)
    return report


def _attention_report(device) -> dict:
    """The attention path the pack's MODELs take at ``INFO_ATTENTION`` on ``device`` and why: on a GPU the choice
    itself (measured now unless an earlier run cached it, as the first sampling pass would)."""
    import torch

    from .kernels import attention_choice, settings

    if settings.attention() == "comfyui":
        return {"path": "comfyui", "reason": f"ComfyUI's own ({settings.said(settings.ATTENTION)})"}
    if device.type != "cuda":
        return {"path": "comfyui", "reason": f"ComfyUI's own on the {device.type.upper()} (the pack's serves CUDA)"}
    if attention_choice.PRIORITY is None:
        return {"path": "comfyui", "reason": "ComfyUI's own (this torch cannot order SDPA backends)"}
    choice = attention_choice.choose(device, attention_choice.Shape(*INFO_ATTENTION), torch.bfloat16)
    return {
        "path": choice.path,
        "label": attention_choice.LABELS[choice.path],
        "reason": choice.reason,
        "ms": choice.ms,
        "errors": choice.errors,
    }


def _family_report(device, arch: str) -> dict:
    """The GPU's config-space family in words, and the kernels' first-use self-check on it (asked above already)."""
    from .kernels import configs, self_check, settings

    family = configs.FAMILIES.get(arch, "no config space of its own: the portable defaults")
    return {
        "family": None if arch == "cpu" else family,
        "self_check": {
            "runs": self_check.applies(device)
            or f"not on this device ({settings.EXPERIMENTS_VAR}=self-check=on turns it on)",
            "results": self_check.results(device),
        },
    }
