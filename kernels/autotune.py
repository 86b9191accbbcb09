"""Per-shape, per-GPU choice of the GEMM tile config.

Key: (arch, GPU name, N, K, M bucket). Lookup order:
1. this process's cache;
2. the user's cache file (earlier autotuning on this GPU);
3. the shipped table measured on H100/H200 (``tuned_configs.json``), so those users never wait;
4. autotuning: time every fitting config of the arch's space on the real operands (one-time,
   seconds per shape; off with IDEOGRAM4_INT8_AUTOTUNE=0), saved to the user's cache file;
5. the heuristic.
Every pick is kept with its source for the registry / panel.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import threading

import torch

from .configs import GemmConfig, config_space, heuristic_config, m_bucket, shipped_config
from .env import arch_name, capability, gpu_name

log = logging.getLogger(__name__)

ENV_AUTOTUNE = "IDEOGRAM4_INT8_AUTOTUNE"
ENV_CACHE_DIR = "IDEOGRAM4_INT8_CACHE_DIR"


def _cache_file() -> pathlib.Path:
    base = os.environ.get(ENV_CACHE_DIR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "comfyui_ideogram4_int8"
    )
    return pathlib.Path(base) / "autotune.json"


class ConfigPicker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._picks: dict[tuple, tuple[GemmConfig, str]] = {}
        # (device, N, K, M, block_n) -> pick: asked on every GEMM call, so skip building the full key
        self._fast: dict[tuple, tuple[GemmConfig, str]] = {}
        self._disk: dict | None = None

    # -- public ---------------------------------------------------------------------------
    def pick(self, q: torch.Tensor, w: torch.Tensor, launch=None, block_n: int | None = None) -> tuple[GemmConfig, str]:
        """Config and its source for q [M,K] x w [N,K]. ``launch(cfg)`` runs one trial (autotune).

        ``block_n`` pins the tile width (the SwiGLU epilogue needs BLOCK_N == 2 x its chunk)."""
        M, K = q.shape
        N = w.shape[0]
        hit = self._fast.get((q.device, N, K, M, block_n))
        if hit is not None:
            return hit
        cc = capability(q.device) if q.is_cuda else None
        arch = arch_name(cc)
        gpu = gpu_name(q.device)
        key = (arch, gpu, N if block_n is None else f"{N}|bn{block_n}", K, m_bucket(M))
        with self._lock:
            hit = self._picks.get(key)
        if hit is not None:
            self._fast[(q.device, N, K, M, block_n)] = hit
            return hit
        found = self._from_disk(key)
        if found is None and block_n is None:
            found = shipped_config(arch, gpu, M, N, K)
        elif found is None:
            found = shipped_config(arch, gpu, M, f"{N}|bn{block_n}", K)
        if found is None and q.is_cuda and launch is not None and os.environ.get(ENV_AUTOTUNE, "1") != "0":
            found = self._autotune(key, arch, M, N, K, q.device, launch, block_n)
        if found is None:
            cfg = heuristic_config(arch, M, N, K)
            if block_n is not None:
                cfg = dataclasses.replace(cfg, block_n=block_n, split_k=1)
            found = (cfg, "heuristic")
        with self._lock:
            self._picks[key] = found
            if len(self._fast) > 4096:
                self._fast.clear()
            self._fast[(q.device, N, K, M, block_n)] = found
        return found

    def picks(self) -> list[dict]:
        with self._lock:
            items = list(self._picks.items())
        return [
            {"arch": a, "gpu": g, "N": n, "K": k, "m_bucket": mb, "config": c.key(), "source": src}
            for (a, g, n, k, mb), (c, src) in items
        ]

    def clear(self) -> None:
        with self._lock:
            self._picks.clear()
            self._fast.clear()
            self._disk = None

    # -- internals ------------------------------------------------------------------------
    def _from_disk(self, key) -> tuple[GemmConfig, str] | None:
        if self._disk is None:
            try:
                self._disk = json.loads(_cache_file().read_text())
            except (OSError, ValueError):
                self._disk = {}
        entry = self._disk.get(_disk_key(key))
        if entry is None:
            return None
        try:
            return GemmConfig.from_dict(entry), "autotuned earlier on this GPU"
        except (KeyError, TypeError, ValueError):
            return None

    def _autotune(self, key, arch, M, N, K, device, launch, block_n=None) -> tuple[GemmConfig, str] | None:
        from triton.testing import do_bench

        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_block_optin", None)
        candidates = config_space(arch, M, smem)
        if block_n is not None:  # the SwiGLU epilogue: the tile width is the weights' interleave
            candidates = [c for c in candidates if c.block_n == block_n and c.split_k == 1]
        from .gemm_triton import _gluon_unavailable

        if _gluon_unavailable(device):
            candidates = [c for c in candidates if not c.gluon]
        log.warning(
            "Ideogram4 INT8: autotuning GEMM N=%d K=%d M~%d over %d configs (one-time; cached in %s)",
            N, K, M, len(candidates), _cache_file(),
        )  # fmt: skip
        best: tuple[float, GemmConfig] | None = None
        for cfg in candidates:
            try:
                ms = do_bench(lambda cfg=cfg: launch(cfg), warmup=5, rep=20, return_mode="median")
            except Exception as exc:  # a config that does not compile or fit is skipped
                log.debug("config %s failed: %s", cfg.key(), exc)
                continue
            if best is None or ms < best[0]:
                best = (ms, cfg)
        if best is None:
            return None
        self._save(key, best[1])
        return best[1], f"autotuned ({best[0] * 1e3:.0f} us)"

    def _save(self, key, cfg: GemmConfig) -> None:
        if self._disk is None:
            self._disk = {}
        self._disk[_disk_key(key)] = cfg.as_dict()
        path = _cache_file()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._disk, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError as exc:  # a read-only home must not break inference
            log.warning("Ideogram4 INT8: could not write autotune cache %s: %s", path, exc)


def _disk_key(key) -> str:
    arch, gpu, n, k, mb = key
    return f"{arch}|{gpu}|{n},{k},{mb}"


PICKER = ConfigPicker()
