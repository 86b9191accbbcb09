"""W8A8 INT8 kernels: activation quantization, fused INT8 GEMM, path dispatch and registry.

Depends on torch and triton only. Public names (stable, see DESIGN.md §6):
``quantize_per_token``, ``int8_matmul``, ``int8_matmul_int32``, ``w8a8_linear``.
"""

from .env import environment_report
from .reference import (
    dequant_linear_ref,
    int8_matmul_int32_ref,
    int8_matmul_ref,
    quantize_per_token_ref,
    quantize_weight_ref,
)

__all__ = [
    "environment_report",
    "quantize_per_token_ref",
    "int8_matmul_ref",
    "int8_matmul_int32_ref",
    "dequant_linear_ref",
    "quantize_weight_ref",
]
