"""The widgets the model nodes (loader, patch, demo loader) share, one form each.

Used as ``io.Combo.Input("gemm_path", **GEMM_PATH, tooltip=...)``: the input's name and tooltip stay written out at
each node, where the tests read them from the source.
"""

from __future__ import annotations

from .. import kernels
from .runtime.native_model import COMPUTE_DTYPES

GEMM_CHOICES = ("auto", kernels.PATH_TRITON, kernels.PATH_CUBLAS, kernels.PATH_DEQUANT)
GEMM_PATH = {"options": list(GEMM_CHOICES), "default": "auto", "advanced": True}
GEMM_PATH_TOOLTIP = (
    "auto: the fused Triton INT8 GEMM where it runs (CUDA sm_80+), else cublas-int8, else dequant-bf16. "
    "Force one to compare"  # each node ends the sentence
)
PROTECTED_CHOICES = ("bf16", "fp8")
PROTECTED_LAYERS = {"options": list(PROTECTED_CHOICES), "default": "bf16", "advanced": True}
PROTECTED_LAYERS_TOOLTIP = (
    "The block layers the checkpoint keeps out of INT8 (the W8A8 file's 17 FFN down-projections). bf16: as stored. "
    "fp8: stored as float8 e4m3 (one scale per layer) on load and run on the fused FP8 GEMM on Ada / Hopper / "
    "Blackwell GPUs (sm_89 / sm_90 / sm_100 / sm_120): faster and ~1.9 GiB smaller for both branches, slightly less "
    "exact; on other GPUs they run dequantized to bf16, labelled in the panel"
)
COMPUTE_DTYPE = {"options": list(COMPUTE_DTYPES), "default": "auto"}
COMPUTE_DTYPE_TOOLTIP = "Activation / float-layer dtype. auto: bf16 on a GPU that supports it, else fp32."
