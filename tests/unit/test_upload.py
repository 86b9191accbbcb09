"""The staged upload of weights (ideogram4.upload) on the CPU: its plan of staging fills, and the same plan run with
host copies (``host_twin``): every tensor arrives bit for bit, the buffers are reused in turn and never refilled
before their copies were sent. The copies to a card on their copy stream are checked on a GPU
(tests/cuda/test_upload_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import upload


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _coverage(fills, sizes):
    """Per tensor, how many times each of its bytes is in the plan."""
    seen = [torch.zeros(s, dtype=torch.int32) for s in sizes]
    for f in fills:
        for s in f.segments:
            seen[s.index][s.offset : s.offset + s.length] += 1
    return seen


def _zoo(g: torch.Generator) -> list[torch.Tensor]:
    """Every dtype the weights come in, a transposed view, zero-size and 0-dim tensors, one larger than a buffer."""
    return [
        torch.randint(-128, 128, (96, 40), dtype=torch.int8, generator=g),
        (torch.randn(3000, generator=g) * 40).to(torch.float8_e4m3fn),
        torch.randn(70, 33, generator=g).bfloat16().t(),  # non-contiguous
        torch.empty(0, 5),
        torch.tensor(2.5),
        torch.randn(6000, generator=g),  # 24000 bytes: several 4 KiB fills
        torch.nn.Parameter(torch.randn(17, generator=g), requires_grad=False),
        torch.randint(0, 2, (9,), generator=g).bool(),
        torch.randint(-(2**40), 2**40, (5,), generator=g),
    ]


def test_the_plan_places_every_byte_once_within_its_buffer():
    sizes = [0, 10, 5000, 3, 4096, 0, 1, 9000, 7]
    fills = upload.plan_fills(sizes, buffer_bytes=4096, buffers=3, align=16)
    assert all(c.eq(1).all() for c in _coverage(fills, sizes))
    for k, f in enumerate(fills):
        assert f.buffer == k % 3
        assert f.extent <= 4096
        spans = sorted((s.staging_offset, s.staging_offset + s.length) for s in f.segments)
        assert all(a % 16 == 0 for a, _ in spans)
        assert all(e <= a for (_, e), (a, _) in zip(spans, spans[1:], strict=False))  # no overlap
    # small tensors share a fill; a tensor larger than a buffer spans several, each piece in order
    assert {s.index for s in fills[0].segments} == {1, 2}
    pieces = [s for f in fills for s in f.segments if s.index == 7]
    assert len(pieces) == 3 and [p.offset for p in pieces] == sorted(p.offset for p in pieces)
    assert not any(s.index in (0, 5) for f in fills for s in f.segments)  # zero-size: nothing to copy


def test_the_plan_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="buffers"):
        upload.plan_fills([10], buffer_bytes=4096, buffers=0)
    with pytest.raises(ValueError, match="buffer_bytes"):
        upload.plan_fills([10], buffer_bytes=8, buffers=2, align=16)
    with pytest.raises(ValueError, match="sizes\\[1\\]"):
        upload.plan_fills([10, -1], buffer_bytes=4096, buffers=2)
    assert upload.plan_fills([], 4096, 2) == [] and upload.plan_fills([0, 0], 4096, 2) == []


@pytest.mark.parametrize("buffers,workers", [(1, 1), (2, 2), (3, 4)])
def test_host_twin_moves_every_tensor_bit_for_bit(buffers, workers):
    g = torch.Generator().manual_seed(5)
    tensors = _zoo(g)
    before = [_bytes(t).clone() for t in tensors]
    trace = []
    out, report = upload.to_device(
        tensors, "cpu", buffers=buffers, buffer_bytes=4096, workers=workers, host_twin=True, trace=trace
    )
    assert report.path == "host-twin" and report.tensors == len(tensors)
    assert report.nbytes == sum(t.numel() * t.element_size() for t in tensors)
    assert report.fills >= 24000 // 4096 and report.buffers == buffers
    for t, o, b in zip(tensors, out, before, strict=True):
        assert type(o) is torch.Tensor and o.shape == t.shape and o.dtype == t.dtype and o.is_contiguous()
        assert torch.equal(_bytes(o), b)
        assert torch.equal(_bytes(t), b)  # the source is left alone
        if t.numel():
            assert o.data_ptr() != t.data_ptr()  # a new tensor, not the source
    # every fill was filled and sent once, in order, fill k in buffer k % buffers, and a buffer was filled again
    # only after its previous fill had been sent
    fills = [e for e in trace if e[0] == "fill"]
    sent = [e for e in trace if e[0] == "sent"]
    assert [k for _, k, _ in sent] == list(range(report.fills))
    assert sorted(k for _, k, _ in fills) == list(range(report.fills))
    assert all(b == k % buffers for _, k, b in trace)
    position = {e: i for i, e in enumerate(trace)}
    for _, k, b in fills:
        if k >= buffers:
            assert position[("sent", k - buffers, b)] < position[("fill", k, b)], k
        assert position[("fill", k, b)] < position[("sent", k, b)]


def test_an_upload_inside_inference_mode_fills_its_buffers_on_worker_threads():
    # ComfyUI samples under torch.inference_mode: a load there makes the staging buffers inference tensors, and the
    # worker threads that fill them start outside inference mode
    g = torch.Generator().manual_seed(6)
    tensors = _zoo(g)
    with torch.inference_mode():
        out, report = upload.to_device(tensors, "cpu", buffers=2, buffer_bytes=4096, workers=2, host_twin=True)
    assert report.path == "host-twin" and report.fills > 2
    assert all(torch.equal(_bytes(o), _bytes(t)) for o, t in zip(out, tensors, strict=True))


def test_only_zero_size_tensors_need_no_buffer():
    out, report = upload.to_device([torch.empty(0), torch.empty(3, 0, dtype=torch.int8)], "cpu", host_twin=True)
    assert report.fills == 0 and report.buffers == 0
    assert [o.shape for o in out] == [(0,), (3, 0)] and out[1].dtype == torch.int8


def test_a_cpu_device_takes_each_tensors_to():
    g = torch.Generator().manual_seed(6)
    tensors = _zoo(g)
    out, report = upload.to_device(tensors, "cpu")
    assert report.path == "to" and report.why == "a cpu device" and report.fills == 0
    assert all(torch.equal(_bytes(o), _bytes(t)) for o, t in zip(out, tensors, strict=True))
    assert "each tensor's .to (a cpu device)" in report.describe()


def test_host_twin_needs_a_cpu_device():
    with pytest.raises(ValueError, match="host_twin"):
        upload.to_device([torch.zeros(3)], "cuda", host_twin=True)


def test_a_worker_failure_reaches_the_caller(monkeypatch):
    class Broken(upload._HostCopies):
        def reuse(self, buffer):
            raise RuntimeError("host copy failed")

    monkeypatch.setattr(upload, "_HostCopies", Broken)
    with pytest.raises(RuntimeError, match="host copy failed"):
        upload.to_device([torch.zeros(10000)], "cpu", buffer_bytes=4096, host_twin=True)


def test_the_report_says_what_went_up_and_how():
    report = upload.UploadReport(
        "staged", 812, 14 * upload.GIB, 2.0, pinned=3, fills=220, buffers=4, buffer_bytes=64 * upload.MIB
    )
    text = report.describe()
    assert text.startswith("14.00 GiB in 812 tensors, 2.00 s (7.0 GiB/s)"), text
    assert "through 4 x 64 MiB pinned staging buffers" in text and "3 straight from pinned memory" in text
    queued = upload.UploadReport("staged", 5, upload.GIB, 0.01, pinned=5, queued=True).describe()
    assert queued == "1.00 GiB in 5 tensors, 0.01 s to queue on a copy stream that the card's next work waits for, " + (
        "5 straight from pinned memory"
    )  # no bandwidth from the time to queue
    refused = upload.UploadReport("to", 2, upload.GIB, 0.5, why="pinned staging memory unavailable: no")
    assert refused.describe().endswith("each tensor's .to (pinned staging memory unavailable: no)")
