"""ideogram4/host_pages.py: which host tensors lie in a private mapping of a file, and their own copy."""

from __future__ import annotations

import sys

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import host_pages

MAPS = """\
7f0000000000-7f0000100000 rw-p 00000000 fe:00 12                     /models/a b.safetensors
7f0000100000-7f0000200000 rw-s 00000000 fe:00 13                     /dev/shm/b
7f0000200000-7f0000300000 rw-p 00000000 00:00 0                      [heap]
7f0000300000-7f0000400000 rw-p 00000000 00:00 0
7f0000500000-7f0000600000 r--p 00001000 fe:00 14                     /usr/lib/libc.so.6
7f0000600000-7f0000700000 rw-p 00000000 fe:00 15                     /models/gone.safetensors (deleted)
7f0000700000-7f0000800000 rw-p 00000000 00:01 16                     /memfd:buffer (deleted)
"""


class _At:
    """A CPU tensor stand-in at a given address."""

    def __init__(self, ptr):
        self.device, self._ptr = torch.device("cpu"), ptr

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return 1


def test_only_private_mappings_of_a_file_count():
    maps = host_pages.FileMappings(MAPS)
    # a deleted file's pages and a memfd are file pages too (for a memfd the copy is only wasted)
    inside = [0x7F0000000000, 0x7F00000FFFFF, 0x7F0000500000, 0x7F0000600000, 0x7F00007FFFFF]
    outside = [0x7F0000100000, 0x7F0000200010, 0x7F0000300000, 0x7F0000400000, 0x7F0000800000, 0x10]
    assert [maps.holds(_At(p)) for p in inside] == [True] * 5
    assert [maps.holds(_At(p)) for p in outside] == [False] * 6
    assert not host_pages.FileMappings("").holds(_At(0x7F0000000000))
    assert not maps.holds(torch.empty(0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_safetensors_tensor_is_file_mapped_and_its_copy_is_not(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    w = torch.randint(-127, 128, (513, 257), dtype=torch.int8)
    save_file({"w": w}, tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt", device="cpu") as f:
        mapped = f.get_tensor("w")
    maps = host_pages.FileMappings()
    assert maps.holds(mapped) and not maps.holds(w)
    own = host_pages.own_copy(mapped.t())  # a strided view: the copy is contiguous
    assert not host_pages.FileMappings().holds(own) and own.is_contiguous() and torch.equal(own, w.t())
