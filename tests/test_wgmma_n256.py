"""The n = 256 int8 wgmma rewrite (kernels/wgmma_n256.py) on the CPU: the PTX pass on hand-made
instruction pairs, its refusals, and an offline sm_90a compile of the real split-K kernel through
Triton's ir_override (ptxas accepts m64n256k32 .s8 and emits half the IGMMA instructions)."""

from __future__ import annotations

import pytest
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels import gemm_gluon as G
from comfyui_ideogram4_int8.kernels import wgmma_n256 as W
from test_gemm_gluon_compile import _ptxas_present, needs_gluon, pristine_triton_language  # noqa: F401

BASE = 4611686293305294848  # a 128-byte-swizzle descriptor's constant bits (SBO 1024 B)
OP = "wgmma.mma_async.sync.aligned"


def _regs(first, n=64):
    return ",".join(f"%r{i}" for i in range(first, first + n))


def _ptx(upper_offset=1024, upper_n=128, k_steps=2):
    """Triton-shaped PTX: k steps of the lower half (B rows 0-127), then the upper half."""
    lines = ["\twgmma.fence.sync.aligned;"]
    for k in range(k_steps):
        lines.append(f"\tadd.s64 \t%rd{20 + k}, %rd33, {BASE + 2 * k};")
        lines.append(f"\tor.b64 \t%rd{30 + k}, %rd34, {BASE + 2 * k};")
        lines.append(f"\t{OP}.m64n128k32.s32.s8.s8 {{{_regs(100)}}}, %rd{20 + k}, %rd{30 + k}, %p{k};")
    for k in range(k_steps):
        lines.append(f"\tadd.s64 \t%rd{40 + k}, %rd34, {BASE + 2 * k + upper_offset};")
        regs = _regs(164, upper_n // 2)
        lines.append(f"\t{OP}.m64n{upper_n}k32.s32.s8.s8 {{{regs}}}, %rd{20 + k}, %rd{40 + k}, %p{k};")
    lines.append("\twgmma.commit_group.sync.aligned;")
    return "\n".join(lines)


def test_pairs_merge_into_n256_with_lower_then_upper_registers():
    merged, pairs = W.merge_n128_pairs(_ptx())
    assert pairs == 2
    wg = [ln.strip() for ln in merged.split("\n") if "wgmma.mma_async" in ln]
    assert wg == [
        f"{OP}.m64n256k32.s32.s8.s8 {{{_regs(100)},{_regs(164)}}}, %rd{20 + k}, %rd{30 + k}, %p{k};"
        for k in range(2)
    ]
    # everything else is left as it was
    assert [ln for ln in merged.split("\n") if "wgmma.mma_async" not in ln] == [
        ln for ln in _ptx().split("\n") if "wgmma.mma_async" not in ln
    ]


@pytest.mark.parametrize(
    "ptx,why",
    [
        (_ptx(upper_offset=512), "lower/upper pairs"),  # B halves not 128 rows apart
        (_ptx(upper_n=64), "not an m64n128k32"),
        ("\tmov.u32 %r1, 0;", "no wgmma"),
        (_ptx().replace("add.s64 \t%rd40, %rd34", "mul.lo.s64 \t%rd40, %rd34"), r"base \+ constant"),
    ],
)
def test_rewrite_refuses_what_does_not_match(ptx, why):
    with pytest.raises(W.MergeError, match=why):
        W.merge_n128_pairs(ptx)


def test_override_file_is_named_by_content(tmp_path):
    a = W.override_path(_ptx(), str(tmp_path))
    assert W.override_path(_ptx(), str(tmp_path)) == a
    assert open(a).read() == W.merge_n128_pairs(_ptx())[0]
    assert W.override_path(_ptx(k_steps=3), str(tmp_path)) != a


def test_config_rules():
    assert G.validate(C.G(1, 128, 256, 4, split_k=5, split_add=1, n256=1).gluon_config()) is None
    assert G.validate(C.G(2, 64, 256, 4, n256=1).gluon_config()) is None
    assert "64 x 256" in G.validate(C.G(2, 128, 128, 5, n256=1).gluon_config())
    assert "64 x 256" in G.validate(G.GluonGemmConfig(mode="pipelined", wgmma_n256=True))
    assert C.G(1, 128, 256, 4, n256=1).key().endswith("_n256")
    assert C.GemmConfig.from_dict(C.G(1, 128, 256, 4, n256=1).as_dict()).n256 == 1


@needs_gluon
@pytest.mark.skipif(not _ptxas_present(), reason="triton's bundled ptxas not found")
def test_offline_compile_of_the_rewritten_split_k_kernel(tmp_path):
    from comfyui_ideogram4_int8.bench.compile_gluon_sm90 import compile_offline, compile_splitk, cubin_stats, ptx_stats

    cfg = C.G(1, 128, 256, 4, split_k=5, split_add=1, n256=1).gluon_config()
    (kernel, grid, args, kwargs), ck = compile_splitk(cfg, M=333)
    path = W.override_path(ck.asm["ptx"], str(tmp_path), row_bytes=cfg.block_k)
    ck2 = compile_offline(kernel, args, dict(kwargs, ir_override=path))
    assert ptx_stats(ck2.asm["ptx"])["wgmma_shapes"] == ["wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8"]
    assert ck2.metadata.shared == ck.metadata.shared and ck2.metadata.name == ck.metadata.name
    before, after = cubin_stats(ck.asm["cubin"]), cubin_stats(ck2.asm["cubin"])
    if "error" not in after:
        assert after["sass_GMMA"] * 2 == before["sass_GMMA"] > 0
        assert after["sass_spill_ops"] == 0 and after.get("local", 0) == 0
