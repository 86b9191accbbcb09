"""How fast host memory pins (cudaHostRegister, as ComfyUI's ``pin_memory``) from one thread and from several, on
tensors of a streamed block's piece sizes; and the ways a weight loaded from a checkpoint can become pinned.

``--source fresh``: touched anonymous memory, registered from 1..N threads; ``--source huge``: the same on memory
advised for transparent huge pages (``host_pages.huge_empty``).
``--source file-cpu`` (no GPU): on the same file's tensors, a write to every page (the copy a writable registration
forces, page by page) against torch's copy into fresh memory on 1..N threads.
``--source file``: the tensors safetensors hands out (``safe_open`` maps the file privately: the weights the pack's
loader gives a MODEL), each made pinned four ways: registered in place (the pack's path: a private file mapping
registered for writing, so every page is copied on its first touch), registered in place read-only, copied to
fresh host memory (torch's parallel copy) then registered, and copied into memory allocated pinned.

    python -m comfyui_ideogram4_int8.bench.probes.pin_probe [--source fresh|huge|file|file-cpu] [--gib 4]
        [--threads 1,2,4,8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import mmap
import os
import sys
import tempfile
import time

import torch

from ...ideogram4.host_pages import own_copy  # the copy the pack pins instead of a file's pages

PIECE = 108 * 2**20  # bytes: a streamed block's largest piece
PORTABLE, READ_ONLY = 1, 8  # cudaHostRegister flags
HUGE_PAGE = 2 * 2**20  # bytes: a transparent huge page on x86-64


def huge_empty(nbytes: int) -> torch.Tensor:
    """A flat uint8 tensor in an anonymous mapping advised for transparent huge pages, from a huge-page boundary."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE)
    region.madvise(mmap.MADV_HUGEPAGE)
    base = torch.frombuffer(region, dtype=torch.uint8)
    pad = -base.data_ptr() % HUGE_PAGE
    return base[pad : pad + nbytes]


def _progress(*what) -> None:
    """One line per step on stderr, flushed: a run cut short still says how far it got."""
    print(*what, file=sys.stderr, flush=True)


def _fresh(total: int, huge: bool = False) -> list[torch.Tensor]:
    make = huge_empty if huge else (lambda n: torch.empty(n, dtype=torch.uint8))
    out = [make(PIECE) for _ in range(max(total // PIECE, 1))]
    for t in out:
        t.fill_(1)  # touched, as a loaded weight is
    return out


def _register(t: torch.Tensor, flags: int = PORTABLE) -> None:
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.nbytes, flags)
    if rc != 0:
        raise RuntimeError(f"cudaHostRegister({flags}) returned {rc}")


def _unregister(t: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def _threads(a, total: int, huge: bool = False) -> dict:
    rows = {}
    for n in [int(x) for x in a.threads.split(",")]:
        ts = _fresh(total, huge)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            list(pool.map(_register, ts))
        pin_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            list(pool.map(_unregister, ts))
        rows[f"threads={n}"] = {
            "pin_gib_s": round(total / 2**30 / pin_s, 2),
            "unpin_gib_s": round(total / 2**30 / (time.perf_counter() - t0), 2),
        }
        _progress(f"threads={n}", rows[f"threads={n}"])
        del ts
    return rows


def _checkpoint(total: int):
    """(path, pieces, GiB, ``pieces()``) of a safetensors file of ``total`` bytes in pieces; ``pieces()`` hands out its
    tensors on a fresh private mapping of the file, as the pack's loader gets a checkpoint's weights."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    n = max(total // PIECE, 1)
    path = os.path.join(tempfile.mkdtemp(), "pieces.safetensors")
    t0 = time.perf_counter()
    save_file({f"p{i}": torch.full((PIECE,), i % 120 + 1, dtype=torch.int8) for i in range(n)}, path)
    _progress("file written", round(time.perf_counter() - t0, 2))

    def pieces():
        with safe_open(path, framework="pt", device="cpu") as f:
            return [f.get_tensor(f"p{i}") for i in range(n)]

    return path, n, n * PIECE / 2**30, pieces


def _file_ways(total: int) -> dict:
    """Each way of pinning the checkpoint's tensors, on a fresh mapping of one file (its pages in the page cache)."""
    path, n, gib, pieces = _checkpoint(total)

    def on_card_equal(pinned, i) -> bool:
        return bool((pinned.to("cuda", non_blocking=True).cpu() == i % 120 + 1).all())

    rows = {}

    def timed(name, make):
        ts = pieces()
        try:
            t0 = time.perf_counter()
            parts, pinned = make(ts)
            seconds = time.perf_counter() - t0
        except RuntimeError as exc:
            rows[name] = {"error": str(exc)}
            return
        rows[name] = {"gib_s": round(gib / seconds, 2), "parts_s": {k: round(v, 3) for k, v in parts.items()}}
        rows[name]["equal_on_card"] = all(on_card_equal(p, i) for i, p in enumerate(pinned[:3]))
        _progress(name, rows[name])
        for p in pinned:
            if name != "pinned alloc + copy":
                _unregister(p)

    def in_place(flags):
        def make(ts):
            for t in ts:
                _register(t, flags)
            return {}, ts

        return make

    def copy_register(ts):
        t0 = time.perf_counter()
        out = [own_copy(t) for t in ts]
        t1 = time.perf_counter()
        for o in out:
            _register(o)
        return {"copy": t1 - t0, "register": time.perf_counter() - t1}, out

    def pinned_copy(ts):
        t0 = time.perf_counter()
        out = [torch.empty_like(t, pin_memory=True) for t in ts]
        t1 = time.perf_counter()
        for o, t in zip(out, ts, strict=True):
            o.copy_(t)
        return {"alloc": t1 - t0, "copy": time.perf_counter() - t1}, out

    timed("in place (the pack's path)", in_place(PORTABLE))
    timed("in place, read-only", in_place(READ_ONLY))
    timed("copy + register", copy_register)
    timed("pinned alloc + copy", pinned_copy)
    os.remove(path)
    return {"pieces": n, "gib": round(gib, 2), "torch_threads": torch.get_num_threads(), "ways": rows}


def _file_cpu(a, total: int) -> dict:
    """The copy-on-write a writable registration of the file's pages forces, against copying them first."""
    path, n, gib, pieces = _checkpoint(total)
    rows = {}
    ts = pieces()
    t0 = time.perf_counter()
    for t in ts:
        t.view(-1)[::4096].add_(0)  # one write per page
    rows["copy-on-write, page by page"] = round(gib / (time.perf_counter() - t0), 2)
    _progress(rows)
    threads = torch.get_num_threads()
    for k in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(k)
        ts = pieces()
        t0 = time.perf_counter()
        out = [own_copy(t) for t in ts]
        rows[f"copy to fresh memory, threads={k}"] = round(gib / (time.perf_counter() - t0), 2)
        _progress(rows)
        del out
    torch.set_num_threads(threads)
    os.remove(path)
    return {"pieces": n, "gib": round(gib, 2), "gib_s": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", choices=("fresh", "huge", "file", "file-cpu"), default="fresh")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--threads", default="1,2,4,8")
    a = ap.parse_args()
    total = int(a.gib * 2**30)
    if a.source == "file-cpu":
        print(json.dumps({"torch": torch.__version__, "cpus": os.cpu_count(), "file_cpu": _file_cpu(a, total)}))
        return
    torch.cuda.init()
    out = {"gib": a.gib, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "source": a.source}
    if a.source in ("fresh", "huge"):
        out["rows"] = _threads(a, total, huge=a.source == "huge")
    else:
        out["file"] = _file_ways(total)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
