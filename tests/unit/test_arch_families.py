"""GPU families (env.arch_name): which config space, shared-memory limit and fp8 tile each compute capability gets.
Pure Python: no GPU, no Triton."""

from __future__ import annotations

import pytest
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels import fp8_gemm
from comfyui_ideogram4_int8.kernels.env import arch_name

# every compute capability NVIDIA has shipped from Turing to consumer Blackwell, and its family
FAMILY_OF = {
    (7, 5): "sm75",  # Turing: below the fused kernels' sm_80
    (8, 0): "sm80",  # A100
    (8, 6): "sm86",  # RTX 30xx, A40
    (8, 7): "sm86",  # Orin
    (8, 9): "sm89",  # RTX 40xx, L40
    (9, 0): "sm90",  # H100, H200
    (10, 0): "sm100",  # B200
    (10, 3): "sm100",  # B300
    (11, 0): "sm110",  # Thor: no family of its own, the portable defaults
    (12, 0): "sm120",  # RTX 50
    (12, 1): "sm120",  # GB10
}


@pytest.mark.parametrize("cc, family", sorted(FAMILY_OF.items()), ids=lambda v: str(v))
def test_every_compute_capability_from_turing_to_consumer_blackwell_has_its_family(cc, family):
    assert arch_name(cc) == family


def test_consumer_blackwell_is_not_the_b200s_family():
    assert arch_name((12, 0)) != "sm100" and arch_name((12, 1)) != "sm100"
    assert C.SMEM_LIMIT["sm120"] == 101376 and C.SMEM_LIMIT["sm100"] == 232448  # the devices' opt-in limits
    # Ada's mma.sync space, not Hopper's TMA / wgmma tiles
    assert C.CONFIG_SPACES["sm120"] == C.CONFIG_SPACES["sm89"]
    assert {c.kernel for c in C.CONFIG_SPACES["sm120"]} == {"triton"}
    assert {c.kernel for c in C.CONFIG_SPACES["sm100"]} == {"triton", "triton-tma"}  # no Hopper-only Gluon


@pytest.mark.parametrize("family", sorted(C.CONFIG_SPACES))
def test_every_config_of_a_family_fits_its_shared_memory(family):
    """Nothing in a family's space is there only to be pruned: every config (and the untuned pick, and the fp8 tile)
    fits the family's limit with config_space's headroom, for the raw and the SwiGLU epilogue alike."""
    limit = C.SMEM_LIMIT[family] - 2048
    for cfg in C.CONFIG_SPACES[family]:
        assert cfg.problem() is None, cfg.key()
        assert cfg.smem_bytes(4) <= limit, (family, cfg.key(), cfg.smem_bytes(4))
        if cfg.problem(2, swiglu=True) is None:
            assert cfg.smem_bytes(2, swiglu=True) <= limit, (family, cfg.key())
    for m in (1, 64, 512, 4608):
        assert C.config_space(family, m), (family, m)
        assert C.heuristic_config(family, m, 4608, 53248).smem_bytes() <= limit, (family, m)
    if family in C.FP8_TILES:
        assert C.FP8_TILES[family].smem_bytes(2) <= limit


def test_an_unknown_family_gets_the_portable_defaults_within_a_conservative_limit():
    space = C.config_space("sm110", 4608)
    assert space and all(c.smem_bytes() <= 99 * 1024 - 2048 for c in space)
    assert all(c.smem_bytes() <= 227 * 1024 - 2048 for c in C.config_space("sm110", 4608, 227 * 1024))


@pytest.mark.parametrize(
    "family, line, runs",
    [
        ("sm89", "3.4", True),
        ("sm90", "3.9", True),
        ("sm100", "3.4", True),
        ("sm120", "3.4", False),  # 3.4 widens e4m3 to f16 for sm_120
        ("sm120", "3.5", True),
        ("sm120", "3.9", True),
        ("sm86", "3.9", False),  # no fp8 tensor cores
        ("sm80", "3.6", False),
    ],
)
def test_fp8_layers_run_on_the_families_and_triton_lines_with_e4m3_mma(family, line, runs):
    why = fp8_gemm.fp8_tile_problem(family, line)
    assert (why is None) == runs, why
    if not runs:
        assert "e4m3" in why or "fp8 tensor cores" in why
