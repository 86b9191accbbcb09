"""The attention choice on a GPU (kernels/attention_choice.py, nodes/runtime/attention_override.py): each 8-bit path
that can run here against float32 attention at Ideogram 4's shapes, the choice with its timings, and the override
running the chosen path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comfyui_ideogram4_int8.kernels import attention_choice as AC
from comfyui_ideogram4_int8.kernels import model_notes, settings
from comfyui_ideogram4_int8.nodes.runtime import attention_override as A

pytestmark = pytest.mark.cuda

# Ideogram 4's attention at 1024x1024 and at a 4096-token image alone: 18 heads of 256
SHAPES = [AC.Shape(4608, 18, 256), AC.Shape(4096, 18, 256)]
EIGHT_BIT = [name for name in AC.CANDIDATES if name != AC.SDPA]
# paths expected within BOUND on the probe inputs; cuDNN's FP8 (per-tensor e4m3) errs more there and is held to its
# own bound in test_attention_fp8_cudnn_gpu.py (the choice measures it and rejects it while it is over BOUND)
WITHIN_BOUND = [AC.INT8]


@pytest.fixture(autouse=True)
def _fresh(setting, tmp_path):
    setting(settings.CACHE_DIR, str(tmp_path))  # measured here, not read from an earlier run's cache
    AC.clear()
    yield
    AC.clear()


def _device():
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("name", WITHIN_BOUND)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_each_available_8bit_path_is_within_its_bound_of_float32_attention(name, shape, gen):
    candidate = AC.CANDIDATES[name]
    why = candidate.unavailable(_device(), shape, torch.bfloat16)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    q, k, v = AC.probe_inputs(_device(), shape, torch.bfloat16, seed=gen.initial_seed())
    out = candidate.run(q, k, v)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    err = AC.worst_head_error(out, ref)
    assert err <= AC.BOUND, (
        f"{name} at {shape}: worst head error {err:.2e} over {AC.BOUND:.0e}, seed {gen.initial_seed()}"
    )
    sdpa = AC.worst_head_error(AC.CANDIDATES[AC.SDPA].run(q, k, v), ref)
    assert sdpa < err  # the 8-bit path is measured against float32, not against a copy of itself


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_choose_measures_every_path_that_can_run_and_keeps_the_numbers(shape):
    if AC.PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    device = _device()
    ready = [n for n, c in AC.CANDIDATES.items() if c.unavailable(device, shape, torch.bfloat16) is None]
    pool = dict(AC.CANDIDATES)  # not the shipped pool: measured on the families whose answer is known too
    choice = AC.choose(device, shape, torch.bfloat16, candidates=pool)
    if ready == [AC.SDPA]:
        assert choice.path == AC.SDPA and choice.reason.startswith("no 8-bit path can run here")
        return
    assert choice.measured and set(choice.ms) == set(ready) and set(choice.errors) == set(ready)
    assert all(ms > 0 for ms in choice.ms.values()) and choice.errors[AC.SDPA] < AC.BOUND / 5
    within = {n: ms for n, ms in choice.ms.items() if choice.errors[n] <= AC.BOUND}
    assert choice.path == min(within, key=within.get)  # the fastest within the bound
    assert f"{choice.path} {choice.ms[choice.path]:.3f} ms" in choice.reason
    assert AC.cache_file().exists() and AC.choose(device, shape, torch.bfloat16, candidates=pool) is choice


def test_the_families_measured_here_measure_only_the_paths_not_measured_there():
    device = _device()
    known = AC.MEASURED_HERE.get(AC.capability(device))
    if known is None:
        pytest.skip("measured on this GPU family in the repository: H100 / H200 only")
    unlisted = [
        n
        for n, c in AC.CANDIDATES.items()
        if n != AC.SDPA and n not in known and c.unavailable(device, SHAPES[0], torch.bfloat16) is None
    ]
    choice = AC.choose(device, SHAPES[0], torch.bfloat16)
    if not unlisted:
        assert choice.path == AC.SDPA and not choice.measured and "measured on this GPU family" in choice.reason
    else:  # a path not listed that can run on this family: measured against SDPA, the known-slower paths are not
        assert choice.measured and set(choice.ms) == {AC.SDPA, *unlisted}
        assert all(f"{n}: measured slower on this GPU family" in choice.reason for n in known)


def test_the_override_runs_the_chosen_path_and_its_output_is_within_the_bound():
    if AC.PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    shape = SHAPES[0]
    override = A.PackAttention("attention-gpu")
    q, k, v = AC.probe_inputs(_device(), shape, torch.bfloat16, seed=7)
    out = override(None, q, k, v, shape.heads, skip_reshape=True, skip_output_reshape=True)
    chosen = AC.lookup(_device(), shape.tokens, shape.heads, shape.head_dim, torch.bfloat16)
    assert chosen is not None and override.runs[chosen.path] == 1 and sum(override.runs.values()) == 1
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert AC.worst_head_error(out, ref) <= AC.BOUND
    note = model_notes.notes("attention-gpu")["attention"]
    assert note.startswith(f"attention at {shape}: {chosen.path}")


@pytest.mark.parametrize("name", EIGHT_BIT)
def test_a_forced_8bit_path_runs_where_it_can_and_says_why_where_not(name, setting):
    shape = SHAPES[1]
    setting(settings.ATTENTION, name)
    why = AC.CANDIDATES[name].unavailable(_device(), shape, torch.bfloat16)
    override = A.PackAttention()
    q, k, v = AC.probe_inputs(_device(), shape, torch.bfloat16)
    override(None, q, k, v, shape.heads, skip_reshape=True)
    choice = AC.lookup(_device(), shape.tokens, shape.heads, shape.head_dim, torch.bfloat16)
    if why is None:
        assert choice.path == name and override.runs[name] == 1
    else:
        assert choice.path == AC.SDPA and why in choice.reason and override.runs[AC.SDPA] == 1
