"""W8A8 INT8 kernels: activation quantization, fused INT8 GEMM, path dispatch and registry.

Depends on torch and triton only (triton is imported lazily, so the pack imports without it).
Public names (stable: tests and users rely on them): ``quantize_per_token``, ``int8_matmul``,
``int8_matmul_int32``, ``w8a8_linear``.
"""

from . import ops, self_check, triton_warm  # noqa: F401 - self_check registers the first-use check with backends
from .backends import DEMOTIONS
from .dispatch import (
    float_linear,
    int8_matmul,
    int8_matmul_int32,
    qk_norm_rope,
    quantize_per_token,
    rms_norm_gated_residual,
    rms_norm_modulate,
    w8a8_linear,
)
from .env import environment_report
from .fp8_gemm import fp8_linear, fp8_matmul
from .gate_up import swiglu_w8a8_pair
from .operands import KernelInputError
from .path_choice import ENV_PATH, GemmPathUnavailable, select_path
from .reference import (
    dequant_fp8_ref,
    dequant_linear_ref,
    epilogue_ref,
    fp8_matmul_ref,
    int8_matmul_int32_ref,
    int8_matmul_ref,
    qk_norm_rope_ref,
    quantize_per_token_ref,
    quantize_weight_ref,
    rms_norm_gated_residual_ref,
    rms_norm_modulate_ref,
)
from .registry import PATH_BF16, PATH_CUBLAS, PATH_DEQUANT, PATH_FP8, PATH_TRITON, PATHS, REGISTRY
from .sites import SITES

__all__ = [
    "quantize_per_token",
    "int8_matmul",
    "int8_matmul_int32",
    "w8a8_linear",
    "swiglu_w8a8_pair",
    "float_linear",
    "fp8_linear",
    "fp8_matmul",
    "qk_norm_rope",
    "qk_norm_rope_ref",
    "rms_norm_modulate",
    "rms_norm_modulate_ref",
    "rms_norm_gated_residual",
    "rms_norm_gated_residual_ref",
    "select_path",
    "environment_report",
    "DEMOTIONS",
    "ops",
    "REGISTRY",
    "SITES",
    "PATHS",
    "PATH_TRITON",
    "PATH_FP8",
    "PATH_CUBLAS",
    "PATH_DEQUANT",
    "PATH_BF16",
    "ENV_PATH",
    "KernelInputError",
    "GemmPathUnavailable",
    "quantize_per_token_ref",
    "int8_matmul_ref",
    "int8_matmul_int32_ref",
    "epilogue_ref",
    "dequant_linear_ref",
    "dequant_fp8_ref",
    "fp8_matmul_ref",
    "quantize_weight_ref",
]
