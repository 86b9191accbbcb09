"""The staged weight upload on a GPU (cuda): ``ideogram4.upload.to_device`` puts every tensor on the card bit for bit
through pinned staging buffers and a copy stream (pageable sources), or straight from pinned sources; and with
ComfyUI on the GPU, the pack's MODEL loads through it and matches ComfyUI's own move (weights, output, memory left on
the card and pinned) in a full load, a LoRA-patched load, a streamed load's resident part and a reload after
ComfyUI's partial unload (the ComfyUI part skips without a ComfyUI checkout, COMFYUI_DIR)."""

from __future__ import annotations

import pytest
import torch
from comfy_check_run import run_nodes_check_on_gpu
from comfyui_ideogram4_int8.ideogram4 import upload
from host_copy_checks import assert_host_copies
from parking_checks import assert_parking
from pin_ahead_checks import assert_pin_ahead
from upload_checks import assert_upload

pytestmark = pytest.mark.cuda
MIB = 2**20


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _sources(g: torch.Generator) -> list[torch.Tensor]:
    """Weights in every dtype the pack stores, pageable and pinned, a transposed view, zero-size and 0-dim tensors,
    and tensors of several staging buffers."""
    pageable = [
        torch.randint(-128, 128, (4608, 1536), dtype=torch.int8, generator=g),  # 6.75 MiB: several 1 MiB buffers
        (torch.randn(1000, 777, generator=g) * 40).to(torch.float8_e4m3fn),
        torch.randn(333, 4608, generator=g).bfloat16().t(),  # non-contiguous
        torch.randn(4608, generator=g),
        torch.empty(0, 4608, dtype=torch.int8),
        torch.tensor(0.125),
        torch.nn.Parameter(torch.randn(12288, generator=g), requires_grad=False),
    ]
    pinned = [
        torch.randint(-128, 128, (3000, 1000), dtype=torch.int8, generator=g).pin_memory(),
        torch.randn(4608, generator=g).pin_memory(),
    ]
    return pageable + pinned


@pytest.mark.parametrize("buffers,buffer_bytes", [(2, 1 * MIB), (upload.BUFFERS, upload.BUFFER_BYTES)])
def test_every_tensor_reaches_the_card_bit_for_bit(buffers, buffer_bytes):
    g = torch.Generator().manual_seed(11)
    sources = _sources(g)
    before = [_bytes(t).clone() for t in sources]
    out, report = upload.to_device(sources, "cuda", buffers=buffers, buffer_bytes=buffer_bytes)
    assert report.path == "staged" and report.pinned == 2 and report.tensors == len(sources)
    assert report.fills >= 1 and report.buffers <= buffers and report.buffer_bytes <= buffer_bytes
    if buffer_bytes == MIB:
        assert report.fills >= 7  # the 6.75 MiB tensor alone spans seven buffers' worth
    for t, o, b in zip(sources, out, before, strict=True):
        assert o.device.type == "cuda" and o.shape == t.shape and o.dtype == t.dtype and o.is_contiguous()
        assert torch.equal(_bytes(o), b)
        assert torch.equal(_bytes(t), b)  # the source is left alone


def test_back_to_back_uploads_into_freed_memory_stay_exact():
    # the first upload's tensors are freed while work queued on the caller's stream still reads them; the second
    # upload may get that memory, and its copies start only after that work (the copy stream waits for the caller's)
    g = torch.Generator().manual_seed(12)
    a = [torch.randint(-128, 128, (2048, 4096), dtype=torch.int8, generator=g) for _ in range(4)]
    first, _ = upload.to_device(a, "cuda", buffer_bytes=4 * MIB)
    sums = [t.float().sum() for t in first]  # queued on the caller's stream, reading the first upload
    del first
    b = [torch.randint(-128, 128, (2048, 4096), dtype=torch.int8, generator=g) for _ in range(4)]
    second, _ = upload.to_device(b, "cuda", buffer_bytes=4 * MIB)
    assert [s.item() for s in sums] == [t.float().sum().item() for t in a]
    assert all(torch.equal(_bytes(o), _bytes(t)) for o, t in zip(second, b, strict=True))


def test_the_packs_model_loads_through_the_staged_upload_as_comfyui_would(tmp_path):
    r = run_nodes_check_on_gpu(tmp_path, "upload")
    assert r["device"] == "cuda"
    assert_upload(r, "staged")
    assert "pinned staging buffers" in r["pack"]["full"]["note"]


def test_an_unload_on_the_gpu_drops_the_card_copies_of_kept_host_tensors(tmp_path):
    r = run_nodes_check_on_gpu(tmp_path, "host_copies")
    assert_host_copies(r)


def test_a_model_unloaded_whole_on_the_gpu_parks_and_takes_back_its_room(tmp_path):
    assert_parking(run_nodes_check_on_gpu(tmp_path, "parking"))


@pytest.mark.parametrize("wait", [False, True])
def test_an_upload_the_host_does_not_wait_for_is_ordered_before_the_streams_next_work(wait):
    """``wait=False``: the host returns with copies in flight, yet work queued next on the current stream sees every
    byte (it waits for the copy stream), from pinned sources and through staging buffers the next upload reuses."""
    g = torch.Generator().manual_seed(5)
    pinned = [torch.randint(-128, 128, (4096, 4096), dtype=torch.int8, generator=g).pin_memory() for _ in range(8)]
    pinned.append(torch.randn(3, 4608, generator=g).bfloat16().pin_memory())
    pageable = [[torch.randint(-128, 128, (2048, 4096), dtype=torch.int8, generator=g) for _ in range(6)] for _ in "ab"]
    runs = []
    for sources in (pinned, *pageable):  # back to back: the next call's fills reuse the freed staging memory
        out, report = upload.to_device(sources, "cuda", buffers=2, buffer_bytes=4 * MIB, wait=wait)
        # exact byte sums queued on the current stream right after, no synchronize between
        runs.append((sources, out, report, [o.reshape(-1).view(torch.uint8).to(torch.int64).sum() for o in out]))
    for sources, out, report, sums in runs:
        assert report.queued is (not wait)
        assert ("to queue on a copy stream" in report.describe()) is (not wait)
        assert [s.item() for s in sums] == [_bytes(t).to(torch.int64).sum().item() for t in sources]
        assert all(torch.equal(_bytes(o), _bytes(t)) for o, t in zip(out, sources, strict=True))


def test_a_models_host_weights_pinned_ahead_are_taken_by_its_first_load_on_the_gpu(tmp_path):
    assert_pin_ahead(run_nodes_check_on_gpu(tmp_path, "pin_ahead"), gpu=True)
