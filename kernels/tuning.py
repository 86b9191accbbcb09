"""Per-shape, per-GPU, per-Triton choice of the GEMM tile config.

A pick is keyed by (arch, GPU name, Triton line, N, K, token bucket, epilogue). Lookup order:
1. this process's picks;
2. the user's autotune cache (earlier autotuning on this GPU, same Triton version and kernel sources);
3. the shipped table ``tuning_table.json`` (measured on H100/H200, provenance per entry), for the same
   Triton line only, so those users never wait;
4. autotuning: time every fitting config of the arch's space that this machine's backends can run
   (one-time, seconds per shape; off with the experiment ``no-autotune``), saved to the cache;
5. the heuristic (portable kernel).
Every pick is kept with its source for the registry and the panel.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import pathlib
import threading

import torch

from . import capture_guard, settings
from .backends import runnable_kernels
from .configs import GemmConfig, config_space, heuristic_config, m_bucket
from .env import arch_name, cache_dir, capability, gpu_name, triton_line, triton_version

log = logging.getLogger(__name__)

TABLE_PATH = pathlib.Path(__file__).with_name("tuning_table.json")
_TABLE_FIELDS = ("arch", "gpu", "triton", "N", "K", "m_bucket", "epilogue", "config", "measured")
# the sources whose change makes earlier autotuning stale (the cache tag hashes them)
_KERNEL_SOURCES = (
    "configs.py",
    "gemm_triton.py",
    "gemm_triton_kernels.py",
    "gemm_gluon.py",
    "gemm_gluon_kernel.py",
    "gemm_gluon_device.py",
    "gluon_api.py",
)


EPILOGUE_LINEAR = "linear"  # dequant (+ bias), or the raw int32 accumulator
EPILOGUE_PAIR = "swiglu-pair"  # SwiGLU of the gate/up pair w1, w3, keyed by the GEMM it computes (N = 2F)
EPILOGUES = (EPILOGUE_LINEAR, EPILOGUE_PAIR)


@functools.lru_cache(maxsize=1)
def shipped_table() -> list[dict]:
    """The shipped entries, each checked: every field present, the config valid (ValueError names the entry)."""
    doc = json.loads(TABLE_PATH.read_text())
    entries = doc["entries"]
    for i, e in enumerate(entries):
        missing = [f for f in _TABLE_FIELDS if f not in e]
        if missing or set(e) - set(_TABLE_FIELDS):
            raise ValueError(f"{TABLE_PATH.name} entry {i}: fields {sorted(e)}; expected {list(_TABLE_FIELDS)}")
        try:
            GemmConfig.from_dict(e["config"])
        except ValueError as exc:
            raise ValueError(f"{TABLE_PATH.name} entry {i}: {exc}") from exc
    return entries


def shipped_config(arch: str, gpu: str | None, line: str, M: int, N: int, K: int, epilogue: str = EPILOGUE_LINEAR):
    """(config, source) of the shipped pick for this call, or None. An exact GPU match first, then any GPU
    of the same arch; only entries measured on this Triton line, with this epilogue."""
    bucket = m_bucket(M)
    hits = [
        e
        for e in shipped_table()
        if e["arch"] == arch
        and e["triton"] == line
        and (e["N"], e["K"], e["m_bucket"]) == (N, K, bucket)
        and e["epilogue"] == epilogue
    ]
    hits.sort(key=lambda e: e["gpu"] != gpu)
    if not hits:
        return None
    e = hits[0]
    where = e["gpu"] if e["gpu"] == gpu else f"{e['gpu']}, same arch"
    return GemmConfig.from_dict(e["config"]), f"shipped table ({where}, Triton {line})"


def _cache_file() -> pathlib.Path:
    return cache_dir() / "autotune.json"


@functools.lru_cache(maxsize=1)
def cache_tag() -> str:
    """Autotune results are valid for one Triton version and one version of the kernel sources."""
    digest = hashlib.sha256()
    for name in _KERNEL_SOURCES:
        digest.update((pathlib.Path(__file__).parent / name).read_bytes())
    return f"triton {triton_version()}; kernels {digest.hexdigest()[:16]}"


class ConfigPicker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._picks: dict[tuple, tuple[GemmConfig, str]] = {}
        # (device, N, K, M, epilogue) -> pick: asked on every GEMM call, so skip building the full key
        self._fast: dict[tuple, tuple[GemmConfig, str]] = {}
        self._disk: dict | None = None

    # -- public ---------------------------------------------------------------------------
    def pick(
        self,
        q: torch.Tensor,
        w: torch.Tensor,
        launch=None,
        epilogue: str = EPILOGUE_LINEAR,
        n: int | None = None,
    ) -> tuple[GemmConfig, str]:
        """Config and its source for q [M,K] x w [N,K]. ``launch(cfg)`` runs one trial (autotune).

        ``epilogue``: the key's epilogue; ``n``: the key's N when it is not w's rows (the gate/up pair computes
        N = 2F from two [F, K] weights)."""
        M, K = q.shape
        N = n or w.shape[0]
        fast = (q.device, N, K, M, epilogue)
        hit = self._fast.get(fast)
        if hit is not None:
            return hit
        arch = arch_name(capability(q.device) if q.is_cuda else None)
        gpu, line = gpu_name(q.device), triton_line()
        key = (arch, gpu, line, N, K, m_bucket(M), epilogue)
        found = self.known(arch, gpu, line, M, N, K, epilogue)
        if found is None and q.is_cuda and launch is not None and not settings.flag("no-autotune"):
            capture_guard.refuse_first_use(q.device, f"autotuning GEMM N={N} K={K} M~{M}")
            found = self._autotune(key, arch, M, N, K, q.device, launch, epilogue == EPILOGUE_PAIR)
        if found is None:
            found = (_heuristic(arch, M, N, K, epilogue), "heuristic")
        with self._lock:
            self._picks[key] = found
            if len(self._fast) > 4096:
                self._fast.clear()
            self._fast[fast] = found
        return found

    def known(self, arch, gpu, line, M: int, N: int, K: int, epilogue: str = EPILOGUE_LINEAR):
        """(config, source) of a call that needs no autotuning: this process's pick, the autotune cache's, the
        shipped table's; else None."""
        key = (arch, gpu, line, N, K, m_bucket(M), epilogue)
        with self._lock:
            found = self._picks.get(key)
        return found or self._from_disk(key) or shipped_config(arch, gpu, line, M, N, K, epilogue)

    def planned(self, arch, gpu, line, M: int, N: int, K: int, epilogue: str = EPILOGUE_LINEAR) -> GemmConfig:
        """The config a call will run without timing anything: the known pick, else the heuristic (which autotuning
        compiles among its trials, and which runs where autotuning is off)."""
        found = self.known(arch, gpu, line, M, N, K, epilogue)
        return found[0] if found else _heuristic(arch, M, N, K, epilogue)

    def picks(self) -> list[dict]:
        with self._lock:
            items = list(self._picks.items())
        return [
            {
                "arch": a,
                "gpu": g,
                "triton": t,
                "N": n,
                "K": k,
                "m_bucket": mb,
                "epilogue": ep,
                "config": c.key(),
                "source": src,
            }
            for (a, g, t, n, k, mb, ep), (c, src) in items
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
                doc = json.loads(_cache_file().read_text())
            except (OSError, ValueError):
                doc = {}
            # another Triton or other kernel sources: earlier timings say nothing about this build
            self._disk = doc.get("picks", {}) if isinstance(doc, dict) and doc.get("tag") == cache_tag() else {}
        entry = self._disk.get(_disk_key(key))
        if entry is None:
            return None
        try:
            return GemmConfig.from_dict(entry), "autotuned earlier on this GPU"
        except (TypeError, ValueError):
            return None

    def _autotune(self, key, arch, M, N, K, device, launch, swiglu=False) -> tuple[GemmConfig, str] | None:
        from triton.testing import do_bench

        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_block_optin", None)
        candidates = config_space(arch, M, smem, runnable_kernels(device))
        if swiglu:  # the configs the SwiGLU epilogue can run (unsplit, subtiles within one half)
            candidates = [c for c in candidates if c.problem(2, swiglu=True) is None]
        log.warning(
            "Ideogram4 INT8: autotuning GEMM N=%d K=%d M~%d over %d configs (one-time; cached in %s)",
            N,
            K,
            M,
            len(candidates),
            _cache_file(),
        )
        best: tuple[float, GemmConfig] | None = None
        for cfg in candidates:
            try:
                ms = do_bench(lambda cfg=cfg: launch(cfg), warmup=5, rep=20, return_mode="median")
            except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit is skipped
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
            tmp.write_text(json.dumps({"tag": cache_tag(), "picks": self._disk}, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError as exc:  # a read-only home must not break inference
            log.warning("Ideogram4 INT8: could not write autotune cache %s: %s", path, exc)


def _heuristic(arch: str, M: int, N: int, K: int, epilogue: str) -> GemmConfig:
    cfg = heuristic_config(arch, M, N, K)
    if epilogue == EPILOGUE_PAIR:  # the SwiGLU epilogue runs unsplit
        cfg = dataclasses.replace(cfg, split_k=1)
    return cfg


def _disk_key(key) -> str:
    arch, gpu, line, n, k, mb, epilogue = key
    return f"{arch}|{gpu}|{n},{k},{mb}|{epilogue}"


PICKER = ConfigPicker()
