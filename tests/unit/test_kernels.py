"""Kernel correctness on the CPU: Triton kernels on the interpreter (TRITON_INTERPRET=1).

Every test draws fresh random data; results are compared bit-exactly with torch._int_mm / the
twin, or with float64 references of the same quantized operands.
"""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm
from kernel_checks import (
    activations,
    check_quantize_edge_rows,
    cosine,
    int8,
    launches,
    reference_f64,
    rel_err,
    weight,
)

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)

POISON_I32 = -(2**31) + 7


# -- int8 x int8 -> int32: bit-exact ------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 17, 333])
@pytest.mark.parametrize("n,k", [(40, 64), (200, 96), (136, 384), (72, 1000)])
def test_int32_accumulator_bit_exact(m, n, k, gen):
    q, w = int8((m, k), gen), int8((n, k), gen)
    out = torch.full((m, n), POISON_I32, dtype=torch.int32)
    before = launches("gemm_triton")
    got = K.int8_matmul_int32(q, w, out=out)
    assert launches("gemm_triton") == before + 1, "the Triton kernel did not run"
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, torch._int_mm(q, w.t())), f"seed {gen.initial_seed()}"


def test_int32_extreme_values_bit_exact(gen):
    # all +-127 / -128 stress the accumulator sign handling
    m, n, k = 33, 48, 512
    q = torch.where(torch.rand(m, k, generator=gen) > 0.5, 127, -127).to(torch.int8)
    w = torch.where(torch.rand(n, k, generator=gen) > 0.5, 127, -128).to(torch.int8)
    assert torch.equal(K.int8_matmul_int32(q, w), torch._int_mm(q, w.t()))


@pytest.mark.parametrize(
    "cfg",
    [
        C.GemmConfig("triton", 64, 64, 32, group_m=4, num_warps=4, num_stages=2),
        C.GemmConfig("triton", 16, 64, 64, group_m=1, num_warps=4, num_stages=2),
        # split-K with a ragged last slice
        C.GemmConfig("triton", 64, 32, 64, group_m=8, split_k=3, num_warps=4, num_stages=2),
        C.GemmConfig("triton", 32, 64, 32, group_m=2, split_k=4, num_warps=4, num_stages=2),
        # TMA descriptors, persistent tile loop
        C.GemmConfig("triton-tma", 32, 64, 32, group_m=2, num_warps=4, num_stages=2),
    ],
    ids=lambda c: c.key(),
)
def test_every_config_family_bit_exact(cfg, gen):
    """Tile shapes, group ordering and split-K (int32 partial slices) all give the exact accumulator."""
    m, n, k = 70, 100, 200
    q, w = int8((m, k), gen), int8((n, k), gen)
    out = torch.full((m, n), POISON_I32, dtype=torch.int32)
    launch_gemm(q, w, cfg, out=out, raw_int32=True)
    assert torch.equal(out, torch._int_mm(q, w.t())), f"{cfg.key()} seed {gen.initial_seed()}"


@pytest.mark.parametrize(
    "cfg",
    [
        C.GemmConfig("triton", 32, 32, 64, group_m=1, num_warps=4, num_stages=2),
        C.GemmConfig("triton", 32, 32, 64, group_m=1, split_k=4, num_warps=4, num_stages=2),
        C.GemmConfig("triton-tma", 32, 32, 64, group_m=2, num_warps=4, num_stages=2),
        C.GemmConfig("triton-tma", 32, 32, 64, group_m=2, num_warps=4, num_stages=2, subtile=True),
    ],
    ids=lambda c: c.key(),
)
def test_fused_epilogue_every_variant_matches_twin(cfg, gen):
    m, n, k = 40, 80, 512  # n = 80: float32 TMA rows 16-element aligned (the 3.4/3.5 interpreters count elements)
    x = activations(m, k, gen)
    q, s = K.quantize_per_token(x)
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    launch_gemm(q, w, cfg, s, ws, bias, out)
    assert torch.equal(out, K.int8_matmul_ref(q, w, s, ws, bias, out_dtype=torch.float32))


# -- activation quantization: identical to the twin ---------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,k", [(1, 64), (17, 300), (40, 4608), (3, 20000)])
@pytest.mark.parametrize("smooth", [False, True])
def test_quantize_identical_to_twin(dtype, m, k, smooth, gen):
    x = activations(m, k, gen, dtype=dtype)
    sm = (torch.rand(k, generator=gen) * 4 + 0.25) if smooth else None
    before = launches("quant_triton")
    q, s = K.quantize_per_token(x, sm)
    assert launches("quant_triton") == before + 1
    qr, sr = K.quantize_per_token_ref(x, sm)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert torch.equal(q, qr), f"seed {gen.initial_seed()}"
    assert torch.equal(s, sr), f"seed {gen.initial_seed()}"
    assert q.abs().max() <= 127


def test_quantize_rounds_half_to_even():
    # row absmax 127 -> inv = 1 exactly, so q = rint(x): halves go to the even neighbour
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]])
    q, s = K.quantize_per_token(x)
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 126]]
    assert s.item() == 1.0


def test_quantize_zero_nan_inf_rows_stay_confined(gen):
    x = activations(6, 256, gen)
    x[1] = 0.0
    x[3, 17] = float("nan")
    x[4, 5] = float("inf")
    q, s = K.quantize_per_token(x)
    qr, sr = K.quantize_per_token_ref(x)
    assert torch.equal(q, qr) and torch.equal(s.isnan(), sr.isnan())
    assert s[1] == 0 and (q[1] == 0).all()
    assert s[3].isnan() and s[4].isnan() and (q[3] == 0).all() and (q[4] == 0).all()
    healthy = [0, 2, 5]
    assert torch.isfinite(s[healthy]).all() and (s[healthy] > 0).all()
    assert torch.equal(q[healthy], K.quantize_per_token_ref(x[healthy])[0])


@pytest.mark.parametrize("k", [256, 4608])
def test_quantize_extreme_rows_match_twin(k, gen):
    check_quantize_edge_rows(k, gen)


def test_quantize_keeps_leading_dims(gen):
    x = activations(2 * 3, 64, gen).reshape(2, 3, 64)
    q, s = K.quantize_per_token(x)
    assert q.shape == (2, 3, 64) and s.shape == (2, 3)
    qr, sr = K.quantize_per_token_ref(x.reshape(6, 64))
    assert torch.equal(q.reshape(6, 64), qr) and torch.equal(s.reshape(6), sr)


# -- whole linear vs float64 --------------------------------------------------------------------

SMALL_IDEOGRAM_LIKE = {  # the real layer ratios at 1/16 width
    "qkv": (864, 288),
    "o": (288, 288),
    "w1": (768, 288),
    "w2": (288, 768),
    "adaln": (1152, 32),
    "llm_cond_proj": (288, 3328),
}


@pytest.mark.parametrize("name", list(SMALL_IDEOGRAM_LIKE))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_linear_triton_vs_float64(name, dtype, with_bias, gen):
    n, k = SMALL_IDEOGRAM_LIKE[name]
    m = 37 if name != "llm_cond_proj" else 24
    x = activations(m, k, gen, dtype=dtype)
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    smooth = torch.rand(k, generator=gen) * 2 + 0.5
    site = f"test/{name}"
    y = K.w8a8_linear(x, w, ws, bias, smooth=smooth, path="triton-int8", site=site)
    assert K.REGISTRY.path_of(site) == "triton-int8"
    assert y.dtype == dtype and y.shape == (m, n)
    q, s = K.quantize_per_token_ref(x, smooth)
    ref = reference_f64(q, s, w, ws, bias)
    tol = 1e-2 if dtype != torch.float32 else 1e-6
    assert rel_err(y, ref) <= tol, f"seed {gen.initial_seed()}"
    assert cosine(y, ref) >= 0.9999


def test_w8a8_linear_zero_rows_give_exact_bias(gen):
    n, k = 96, 128
    x = activations(5, k, gen, dtype=torch.bfloat16)
    x[2] = 0
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen).bfloat16()
    for path in ("triton-int8", "cublas-int8", "dequant-bf16"):
        y = K.w8a8_linear(x, w, ws, bias, path=path)
        assert torch.equal(y[2], bias), path
        assert torch.isfinite(y).all(), path


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float16])
def test_half_bias_reaches_the_fused_kernel_unconverted_and_exact(bias_dtype, gen, monkeypatch):
    """A bf16/fp16 bias goes into the fused kernel as it is (widened in registers, exactly): the
    output equals the one with the same bias given in float32, and no float32 copy was made."""
    from comfyui_ideogram4_int8.kernels import dispatch

    n, k, m = 136, 288, 19
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w, ws = weight(n, k, gen)
    bias = (torch.randn(n, generator=gen) * 3).to(bias_dtype)
    seen = []
    real = dispatch._launch_fused
    monkeypatch.setattr(
        dispatch, "_launch_fused", lambda q, w, qs, s, b, *a, **kw: seen.append(b) or real(q, w, qs, s, b, *a, **kw)
    )
    y_half = K.w8a8_linear(x, w, ws, bias, path="triton-int8")
    y_f32 = K.w8a8_linear(x, w, ws, bias.float(), path="triton-int8")
    assert seen[0] is bias and seen[1].dtype == torch.float32
    assert torch.equal(y_half, y_f32)
    q, s = K.quantize_per_token(x)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    assert torch.equal(
        K.int8_matmul(q, w, s, ws, bias, torch.float32, out=out),
        K.int8_matmul_ref(q, w, s, ws, bias.float(), torch.float32),
    )


def test_w8a8_linear_nan_row_confined(gen):
    n, k = 64, 128
    x = activations(4, k, gen)
    x[1, 3] = float("nan")
    w, ws = weight(n, k, gen)
    y = K.w8a8_linear(x, w, ws, path="triton-int8")
    assert y[1].isnan().all()
    assert torch.isfinite(y[[0, 2, 3]]).all()


def test_w8a8_linear_nd_input(gen):
    x = activations(2 * 9, 64, gen).reshape(2, 9, 64)
    w, ws = weight(32, 64, gen)
    y = K.w8a8_linear(x, w, ws, path="triton-int8")
    assert y.shape == (2, 9, 32)
    y2 = K.w8a8_linear(x.reshape(18, 64), w, ws, path="triton-int8")
    assert torch.equal(y.reshape(18, 32), y2)


@pytest.mark.parametrize("path", ["cublas-int8", "dequant-bf16"])
def test_fallback_paths_vs_float64(path, gen):
    n, k, m = 200, 256, 33
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen)
    smooth = torch.rand(k, generator=gen) + 0.5
    y = K.w8a8_linear(x, w, ws, bias, smooth=smooth, path=path, site=f"test/{path}")
    assert K.REGISTRY.path_of(f"test/{path}") == path
    q, s = K.quantize_per_token_ref(x, smooth)
    ref = reference_f64(q, s, w, ws, bias)
    # dequant-bf16 rounds both operands to bf16 before the matmul: a looser, still tight, bound
    assert rel_err(y, ref) <= (1e-2 if path == "cublas-int8" else 2e-2)
    assert cosine(y, ref) >= 0.9999


def test_int8_matmul_writes_every_output(gen):
    m, n, k = 50, 70, 96
    q, w = int8((m, k), gen), int8((n, k), gen)
    s = torch.rand(m, generator=gen)
    ws = torch.rand(n, generator=gen)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    K.int8_matmul(q, w, s, ws, out_dtype=torch.float32, out=out)
    assert torch.isfinite(out).all()
    assert torch.equal(out, K.int8_matmul_ref(q, w, s, ws, out_dtype=torch.float32))


def test_scales_accept_bf16_and_column_shape(gen):
    m, n, k = 9, 24, 64
    x = activations(m, k, gen)
    w, ws = weight(n, k, gen)
    a = K.w8a8_linear(x, w, ws.bfloat16().reshape(n, 1), path="triton-int8")
    b = K.w8a8_linear(x, w, ws.bfloat16().float(), path="triton-int8")
    assert torch.equal(a, b)


# -- dispatch and registry ----------------------------------------------------------------------


def test_auto_path_on_cpu_is_labelled_fallback(gen):
    x = activations(4, 64, gen)
    w, ws = weight(16, 64, gen)
    K.w8a8_linear(x, w, ws, site="auto/cpu")
    rec = next(r for r in K.REGISTRY.layers("auto") if r.layer == "cpu")
    assert rec.path == "cublas-int8"
    assert "CUDA" in rec.reason  # says why the fused path was not taken


def test_env_var_forces_path_leniently(gen, setting):
    x = activations(4, 64, gen)
    w, ws = weight(16, 64, gen)
    setting(K.ENV_PATH, "dequant-bf16")
    K.w8a8_linear(x, w, ws, site="env/a")
    assert K.REGISTRY.path_of("env/a") == "dequant-bf16"
    setting(K.ENV_PATH, "no-such-path")
    K.w8a8_linear(x, w, ws, site="env/b")
    rec = next(r for r in K.REGISTRY.layers("env") if r.layer == "b")
    assert rec.path == "cublas-int8" and "no-such-path" in rec.reason


def test_forced_path_argument_is_strict(gen):
    with pytest.raises(K.GemmPathUnavailable, match="expected one of"):
        K.w8a8_linear(activations(2, 64, gen), *weight(16, 64, gen), path="fp8")


def test_registry_counts_and_models(gen):
    K.REGISTRY.clear("regtest")
    w, ws = weight(16, 64, gen)
    x = activations(3, 64, gen)
    K.w8a8_linear(x, w, ws, path="triton-int8", site="regtest/a")
    K.w8a8_linear(x, w, ws, path="dequant-bf16", site="regtest/b")
    K.float_linear(x, torch.randn(16, 64, generator=gen), site="regtest/c", reason="protected layer")
    counts = K.REGISTRY.counts("regtest")
    assert counts == {"triton-int8": 1, "triton-fp8": 0, "cublas-int8": 0, "dequant-bf16": 1, "bf16": 1}
    assert "regtest" in K.REGISTRY.models()
    rec = {r.layer: r for r in K.REGISTRY.layers("regtest")}
    assert rec["a"].config is not None and rec["a"].config_source
    assert rec["c"].reason == "protected layer"


# -- bad input ------------------------------------------------------------------------------------


def test_bad_inputs_name_the_argument(gen):
    w, ws = weight(16, 64, gen)
    x = activations(3, 64, gen)
    with pytest.raises(K.KernelInputError, match="last dim must be K"):
        K.w8a8_linear(activations(3, 63, gen), w, ws)
    with pytest.raises(K.KernelInputError, match="w8a8_linear: w must be a 2-D int8"):
        K.w8a8_linear(x, w.float(), ws)
    with pytest.raises(K.KernelInputError, match="K-contiguous"):
        K.w8a8_linear(x, int8((64, 16), gen).t(), ws)
    with pytest.raises(K.KernelInputError, match=r"w_scale must have shape \[16\]"):
        K.w8a8_linear(x, w, ws[:15])
    with pytest.raises(K.KernelInputError, match=r"smooth must have shape \[64\]"):
        K.w8a8_linear(x, w, ws, smooth=torch.ones(32))
    with pytest.raises(K.KernelInputError, match="x must be float"):
        K.w8a8_linear(x.int(), w, ws)
    with pytest.raises(K.KernelInputError, match="K must match"):
        K.int8_matmul_int32(int8((3, 32), gen), w)
    with pytest.raises(K.KernelInputError, match="exceeds 133144"):
        K.int8_matmul_int32(int8((1, 133145), gen), int8((1, 133145), gen))
    with pytest.raises(K.KernelInputError, match="out must be"):
        K.int8_matmul_int32(int8((3, 64), gen), w, out=torch.empty(3, 16))


def test_config_spaces_fit_their_architectures():
    for arch, limit in C.SMEM_LIMIT.items():
        for m in (16, 512, 4608):
            space = C.config_space(arch, m)
            assert space, (arch, m)
            assert all(c.smem_bytes() <= limit and c.problem() is None for c in space)
    # Hopper's large-M tiles must all qualify for int8 wgmma
    assert all(c.uses_wgmma_on_hopper() for c in C.config_space("sm90", 4608))
    # sm86 has ~99 KB: no 3-stage 128x128x128 tile there
    assert all(c.smem_bytes() <= 96 * 1024 for c in C.config_space("sm86", 4608))


def test_heuristic_splits_long_k_few_tiles():
    cfg = C.heuristic_config("sm90", 512, 4608, 53248)
    assert cfg.split_k > 1
    assert C.heuristic_config("sm90", 4608, 13824, 4608).split_k == 1


def test_every_shipped_pick_lies_in_its_search_space_and_says_where_it_was_measured():
    from comfyui_ideogram4_int8.kernels import tuning

    entries = tuning.shipped_table()
    assert entries
    for e in entries:
        cfg = C.GemmConfig.from_dict(e["config"])
        # a known arch (CONFIG_SPACES' keys are the ones the picker and the offline compile serve), a config its
        # autotuning could have chosen
        assert cfg in C.CONFIG_SPACES[e["arch"]], (e["gpu"], e["N"], e["K"], cfg.key())
        assert cfg.problem(2, swiglu=e["epilogue"] != "linear") is None, cfg.key()
        assert e["measured"].strip() and "commit" in e["measured"]
        assert e["triton"].count(".") == 1 and e["epilogue"] in tuning.EPILOGUES
        assert e["m_bucket"] == C.m_bucket(e["m_bucket"])  # a real bucket
    keys = [(e["arch"], e["gpu"], e["triton"], e["N"], e["K"], e["m_bucket"], e["epilogue"]) for e in entries]
    assert len(keys) == len(set(keys)), "two entries for one key"


def test_shipped_lookup_by_gpu_then_arch_and_never_across_triton_lines():
    from comfyui_ideogram4_int8.kernels import tuning

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    cfg, source = tuning.shipped_config("sm90", h200, "3.6", 4096, 4608, 12288)
    assert cfg.kernel == "gluon-pingpong" and source == "shipped table (NVIDIA H200, Triton 3.6)"
    cfg, source = tuning.shipped_config("sm90", h200, "3.6", 4608, 13824, 4608)
    assert cfg.is_gluon and f"{h100}, same arch" in source
    assert tuning.shipped_config("sm90", h100, "3.9", 4608, 13824, 4608) is None
    assert tuning.shipped_config("sm80", h100, "3.6", 4608, 13824, 4608) is None
    cfg, _ = tuning.shipped_config("sm90", h100, "3.6", 4608, 24576, 4608, epilogue=tuning.EPILOGUE_PAIR)
    assert cfg.block_n == 256
    assert tuning.shipped_config("sm90", h100, "3.6", 4608, 24576, 4608) is None  # a plain linear of that shape


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"kernel": "triton", "persistent": 1}, "unknown GemmConfig field"),
        ({"kernel": "cutlass"}, "kernel must be one of"),
        ({"kernel": "triton", "block_m": "128"}, "expected int"),
        ({"kernel": "triton", "block_m": 96}, "powers of two"),
        ({"kernel": "gluon-ws", "block_m": 64, "block_n": 256}, "64 rows per consumer"),
        ({"kernel": "gluon-ws", "block_n": 256, "num_stages": 6}, "shared memory"),
        ({"kernel": "triton-tma", "split_k": 2}, "runs unsplit"),
    ],
)
def test_config_from_dict_is_strict(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        C.GemmConfig.from_dict(bad)


def test_config_keys_are_one_format_and_unique():
    space = {c for cs in C.CONFIG_SPACES.values() for c in cs}
    keys = {c.key() for c in space}
    assert len(keys) == len(space)
    split = C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=5)
    assert split.key() == "gluon-ws/128x256x128/g8/w4/s4/sk5/e64"
    tma = C.GemmConfig("triton-tma", 128, 256, 128, num_warps=8, subtile=True)
    assert tma.key() == "triton-tma/128x256x128/g8/w8/s3/sub"


def test_autotune_cache_is_keyed_by_triton_and_kernel_sources(tmp_path, setting):
    from comfyui_ideogram4_int8.kernels import settings, tuning

    setting(settings.CACHE_DIR, str(tmp_path))
    picker = tuning.ConfigPicker()
    key = ("sm90", "GPU X", "3.6", 4608, 4608, 4096, "linear")
    cfg = C.CONFIG_SPACES["sm90"][0]
    picker._save(key, cfg)
    assert tuning.ConfigPicker()._from_disk(key) == (cfg, "autotuned earlier on this GPU")
    doc = __import__("json").loads((tmp_path / "autotune.json").read_text())
    assert doc["tag"] == tuning.cache_tag() and "triton" in doc["tag"] and "kernels" in doc["tag"]
    doc["tag"] = doc["tag"].replace("kernels ", "kernels 0")  # other kernel sources (or another Triton)
    (tmp_path / "autotune.json").write_text(__import__("json").dumps(doc))
    assert tuning.ConfigPicker()._from_disk(key) is None


@pytest.mark.parametrize("block_m", [1, 2])
@pytest.mark.parametrize("k,block_k,tail_k", [(4608, 4096, 512), (12288, 8192, 4096), (1500, 1024, 512), (96, 64, 32)])
def test_quantize_one_pass_with_tail_tile_identical_to_twin(k, block_k, tail_k, block_m, gen):
    """The one-pass quantizer holding a row as a BLOCK_K tile plus a TAIL_K tile (exact split and a
    masked remainder): same bytes and scales as the twin, zero and NaN rows included. BLOCK_M = 1
    keeps the row's absmax, inv and ok as scalars (the GPU default), BLOCK_M = 2 as vectors."""
    from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton

    x = activations(6, k, gen, dtype=torch.bfloat16)
    x[1] = 0
    x[2, k - 1] = float("nan")
    smooth = torch.rand(k, generator=gen) + 0.5
    for sm in (None, smooth):
        params = dict(BLOCK_M=block_m, BLOCK_K=block_k, ONE_PASS=True, TAIL_K=tail_k, num_warps=4)
        q, s = quantize_rows_triton(x, sm, params)
        qr, sr = K.quantize_per_token_ref(x, sm)
        assert torch.equal(q, qr)
        assert torch.equal(s.nan_to_num(-1.0), sr.nan_to_num(-1.0)) and s[1] == 0 and s[2].isnan()
