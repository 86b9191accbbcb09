"""What a pass's CUDA graph is keyed on (``graph_replay.signature``), and that CPU passes never reach a graph."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4.graph_replay import PassGraphs, signature


def test_signature_tells_apart_what_a_graph_cannot_serve():
    x = torch.randn(2, 8, 4)
    base = signature((x, torch.ones(1)), {"control": None})
    assert signature((torch.randn(2, 8, 4), torch.zeros(1)), {"control": None}) == base  # new values: same graph
    differs = [
        signature((torch.randn(2, 8, 5), torch.ones(1)), {"control": None}),  # shape
        signature((x.double(), torch.ones(1)), {"control": None}),  # dtype
        signature((x.transpose(0, 1).contiguous().transpose(0, 1), torch.ones(1)), {"control": None}),  # strides
        signature((x, None), {"control": None}),  # a tensor against None
        signature((x, torch.ones(1)), {"control": 3}),  # a plain value
        signature((x, torch.ones(1)), {"other": None}),  # a keyword
        signature((x, torch.ones(1)), {"control": None}, fingerprint=(1, 2)),  # weights elsewhere
    ]
    assert all(d != base for d in differs) and len(set(differs)) == len(differs)
    with pytest.raises(TypeError, match="object"):
        signature((x, object()), {})


def test_passes_on_a_cpu_run_eagerly_and_keep_nothing():
    graphs = PassGraphs()
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    x = torch.randn(3)
    for _ in range(4):
        out, mode = graphs.run(fn, (x,), {})
        assert mode == "eager" and torch.equal(out, x + 1)
    assert len(calls) == 4 and graphs.stats.captures == 0 and not graphs._entries
