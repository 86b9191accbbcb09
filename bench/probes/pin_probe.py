"""How fast host memory pins (cudaHostRegister, as ComfyUI's ``pin_memory``) from one thread and from several, on
fresh pageable tensors of a streamed block's piece sizes; and the host-to-device copy from pageable and pinned.

    python -m comfyui_ideogram4_int8.bench.probes.pin_probe [--gib 4] [--threads 1,2,4,8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time

import torch

PIECE = 108 * 2**20  # bytes: a streamed block's largest piece


def _fresh(total: int) -> list[torch.Tensor]:
    out = [torch.empty(PIECE, dtype=torch.uint8) for _ in range(max(total // PIECE, 1))]
    for t in out:
        t.fill_(1)  # touched, as a loaded weight is
    return out


def _register(t: torch.Tensor) -> None:
    assert torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.nbytes, 1) == 0


def _unregister(t: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--threads", default="1,2,4,8")
    a = ap.parse_args()
    total = int(a.gib * 2**30)
    torch.cuda.init()
    rows = {}
    for n in [int(x) for x in a.threads.split(",")]:
        ts = _fresh(total)
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
        del ts
    print(json.dumps({"gib": a.gib, "gpu": torch.cuda.get_device_name(), "rows": rows}))


if __name__ == "__main__":
    main()
