"""Fake attention candidates and a fake timer for the attention choice's CPU tests (kernels/attention_choice.py)."""

from __future__ import annotations

import torch.nn.functional as F


class FakeCandidate:
    """A candidate named ``name`` that runs float SDPA (``noise`` added to its output, to give it an error), or
    raises when ``fail``; ``why_not``: its answer to ``unavailable``. ``calls`` counts its runs."""

    def __init__(self, name, noise=0.0, fail=False, why_not=None):
        self.name, self.noise, self.fail, self.why_not, self.calls = name, noise, fail, why_not, 0

    def unavailable(self, device, shape=None, dtype=None):
        return self.why_not

    def run(self, q, k, v):
        self.calls += 1
        if self.fail:
            raise RuntimeError(f"{self.name} broke")
        out = F.scaled_dot_product_attention(q, k, v)
        return out + self.noise * out.abs().mean() if self.noise else out


def fake_timer(fakes: dict, ms: dict):
    """A timer that runs the function once and answers ``ms`` of the candidate that ran; ``timer.timed`` lists
    the names it timed."""

    def timer(fn):
        before = {n: f.calls for n, f in fakes.items()}
        fn()
        ran = [n for n, f in fakes.items() if f.calls > before[n]]
        timer.timed.append(ran[0])
        return ms[ran[0]]

    timer.timed = []
    return timer
