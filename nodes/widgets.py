"""The widgets the model nodes (loader, patch, demo loader) share, one form each.

Used as ``io.Combo.Input("gemm_path", **GEMM_PATH, tooltip=...)``: the input's name and tooltip stay written out at
each node, where the tests read them from the source.
"""

from __future__ import annotations

from .. import kernels
from .native_model import COMPUTE_DTYPES

GEMM_CHOICES = ("auto", kernels.PATH_TRITON, kernels.PATH_CUBLAS, kernels.PATH_DEQUANT)
GEMM_PATH = {"options": list(GEMM_CHOICES), "default": "auto", "advanced": True}
GEMM_PATH_TOOLTIP = (
    "auto: the fused Triton INT8 GEMM where it runs (CUDA sm_80+), else cublas-int8, else dequant-bf16. "
    "Force one to compare"  # each node ends the sentence
)
COMPUTE_DTYPE = {"options": list(COMPUTE_DTYPES), "default": "auto"}
COMPUTE_DTYPE_TOOLTIP = "Activation / float-layer dtype. auto: bf16 on a GPU that supports it, else fp32."
