"""How fast ``ideogram4.upload.to_device`` moves pageable host tensors to the card, per staging layout.

Each layout is ``BUFFERSxMIBxWORKERS`` (staging buffers, MiB each, fill threads). The tensors are touched pageable
host memory of a W8A8 block's weight sizes, as a reload after an unload finds the kept host copies. Each layout runs
twice; the second run is reported (the first allocates its pinned staging buffers). The same bytes from pinned host
memory give the bus's ceiling in that process.

    python -m comfyui_ideogram4_int8.bench.probes.upload_probe [--gib 6] [--layouts 4x64x4,8x32x8,8x64x8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from ...ideogram4 import upload
from ...ideogram4.config import BLOCK_LINEARS, Ideogram4Config

_FULL = Ideogram4Config.full()
# one block's linear weights of the published model, one int8 byte per weight
BLOCK_PIECES = tuple(getattr(_FULL, fin) * getattr(_FULL, fout) for _, fin, fout, _ in BLOCK_LINEARS)


def _progress(*what) -> None:
    print(*what, file=sys.stderr, flush=True)


def _tensors(total: int) -> list[torch.Tensor]:
    out, used = [], 0
    while used < total:
        for size in BLOCK_PIECES:
            t = torch.empty(size, dtype=torch.int8)
            t.fill_(1)  # touched: a kept host copy's pages are resident
            out.append(t)
            used += size
    return out


def _layout(text: str) -> tuple[int, int, int]:
    buffers, mib, workers = (int(x) for x in text.split("x"))
    return buffers, mib, workers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=6.0)
    ap.add_argument("--layouts", default="4x64x4,8x32x8,8x64x8,6x64x6,12x32x12,16x16x16")
    a = ap.parse_args()
    torch.cuda.init()
    tensors = _tensors(int(a.gib * 2**30))
    nbytes = sum(t.nbytes for t in tensors)
    rows = {}
    pinned = [t.pin_memory() for t in tensors[:8]]
    t0 = time.perf_counter()
    for t in pinned:
        t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    rows["pinned .to (8 tensors)"] = round(sum(t.nbytes for t in pinned) / 2**30 / (time.perf_counter() - t0), 1)
    del pinned
    for text in a.layouts.split(","):
        buffers, mib, workers = _layout(text)
        for _ in range(2):
            outs, report = upload.to_device(tensors, "cuda", buffers=buffers, buffer_bytes=mib * 2**20, workers=workers)
            del outs
        rows[text] = round(report.gib_per_s, 1)
        _progress(text, rows[text], "GiB/s")
    first = tensors[:4]
    ok = all(bool((o.cpu() == 1).all()) for o in upload.to_device(first, "cuda")[0])
    print(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "cpus": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "gib": round(nbytes / 2**30, 2),
                "equal_on_card": ok,
                "gib_s": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
