"""kernels.sites: the call site of a weight tensor, found at run time by the registered ops under torch.compile."""

from __future__ import annotations

import gc

import torch
from comfyui_ideogram4_int8.kernels import sites


class _Layer(torch.nn.Module):
    def __init__(self, site: str, n: int = 8, k: int = 4) -> None:
        super().__init__()
        self.site = site
        self.register_buffer("weight", torch.zeros(n, k, dtype=torch.int8))


def _weight(m):
    return (m.weight,)


def test_each_weight_finds_its_own_site_and_a_view_or_copy_finds_none():
    book = sites.SiteBook()
    layers = [_Layer(f"m/layers.{i}.o") for i in range(3)]
    for m in layers:
        book.track(m, _weight)
    assert [book.find(m.weight) for m in layers] == ["m/layers.0.o", "m/layers.1.o", "m/layers.2.o"]
    assert book.find(layers[1].weight.clone()) is None  # same values, other storage
    assert book.find(layers[1].weight[:4]) is None  # same address, other shape
    assert book.rebuilds == 3  # the first lookup built the table; each unknown tensor rebuilt it once


def test_a_moved_or_replaced_weight_is_found_after_a_rebuild_and_the_old_address_is_not():
    book = sites.SiteBook()
    m = _Layer("m/layers.0.qkv")
    book.track(m, _weight)
    old = m.weight
    assert book.find(old) == "m/layers.0.qkv"
    m.weight = torch.ones(8, 4, dtype=torch.int8)  # re-quantized (a merged LoRA) or moved to another device
    assert book.find(m.weight) == "m/layers.0.qkv"
    assert book.find(old) is None
    m.site = "other/layers.0.qkv"  # relabelled: read again at the next rebuild
    m.weight = torch.full((8, 4), 2, dtype=torch.int8)
    assert book.find(m.weight) == "other/layers.0.qkv"


def test_a_freed_weight_whose_address_is_reused_is_not_taken_for_its_layer():
    book = sites.SiteBook()
    m = _Layer("m/layers.0.w1", n=64, k=64)
    book.track(m, _weight)
    assert book.find(m.weight) == "m/layers.0.w1"
    del m
    gc.collect()
    stranger = torch.zeros(64, 64, dtype=torch.int8)  # may well land on the freed address
    assert book.find(stranger) is None


def test_an_unknown_address_rebuilds_at_most_once_per_retry_period(monkeypatch):
    book = sites.SiteBook()
    book.track(_Layer("m/a"), _weight)
    t = torch.zeros(3, dtype=torch.int8)
    now = [100.0]
    monkeypatch.setattr(sites.time, "monotonic", lambda: now[0])
    assert book.find(t) is None and book.rebuilds == 1
    assert book.find(t) is None and book.rebuilds == 1  # within RETRY_S: no rebuild
    now[0] += sites.RETRY_S + 0.1
    assert book.find(t) is None and book.rebuilds == 2


def test_a_weight_two_models_share_names_both_sites():
    """The Patch node takes a MODEL's int8 layers as they are: two models, one tensor; the op counts the call for
    both (neither bypass check sees a layer that did not run)."""
    book = sites.SiteBook()
    a, b = _Layer("first/layers.0.o"), _Layer("second/layers.0.o")
    b.weight = a.weight
    book.track(a, _weight)
    book.track(b, _weight)
    assert book.find_all(a.weight) == ("first/layers.0.o", "second/layers.0.o")
    assert book.find(a.weight) == "first/layers.0.o"
    b.site = "third/layers.0.o"
    book.track(b, _weight)  # tracked again after a relabel: the table is built anew
    assert book.find_all(a.weight) == ("first/layers.0.o", "third/layers.0.o")
