"""The GEMM-status route and websocket event in a real ComfyUI 0.33, driven by the pack's real nodes (``comfyui``).

Skipped without ``COMFYUI_DIR``. ``tests/comfyui_server.py`` starts that ComfyUI (``--cpu``) in a temporary
``--base-directory`` with this pack and the test-only node pack ``tests/comfy_test_pack`` linked into
``custom_nodes``; nothing is written into ``COMFYUI_DIR``. Before it starts, ``setup_files`` writes a tiny
synthetic two-branch W8A8 checkpoint (``ideogram4.synthetic.write_w8a8``) into ``models/diffusion_models`` and a
file of text features.

The prompt is the pack's own graph: **Ideogram 4 INT8 Loader** (``Ideogram4Int8Loader``) -> **Ideogram 4
Sampler** (``Ideogram4Int8Sampler``) -> ``SaveLatent`` (no VAE needed). The sampler's ``positive`` comes from
the test pack's ``Ideogram4TestConditioning`` node, which loads the text features from that file: Ideogram 4's
8B text encoder is not on test machines. Everything else — loading, the native MODELs, sampling, the registry,
the route and the websocket push — is what a user runs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import socket
import struct
import time
import urllib.error
import urllib.request
import uuid

import jsonschema
import pytest
from comfyui_ideogram4_int8.kernels import PATHS
from comfyui_ideogram4_int8.nodes import status_report as status

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
WEIGHTS = "ideogram4-tiny-w8a8.safetensors"
COND = "ideogram4_test_cond.safetensors"
TEXT_TOKENS = 5
STEPS = 2  # custom preset: 1 main step (guidance 7) + 1 polish step (guidance 3)
SIZE = 256  # the sampler's smallest size: a 16 x 16 latent
LOADER, CONDITIONING, SAMPLER, SAVE = "1", "2", "3", "4"  # node ids of the prompt
BRANCHES = ["conditional", "unconditional"]
REASON_PROTECTED = "protected in checkpoint (stored bf16)"  # nodes/runtime/int8_ops.py
REASON_TOP = "unquantized top-level layer"
# a variable of the test process must not leak into the server; a test sets what it needs
CLEAN_ENV = {"IDEOGRAM4_INT8_GEMM_PATH": None, "IDEOGRAM4_INT8_GEMM_TIMING": None}


def _config():
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config

    return Ideogram4Config.tiny()


def setup_files(base: pathlib.Path) -> None:
    """The tiny two-branch W8A8 checkpoint and the text features, in the server's base directory."""
    import torch
    from comfyui_ideogram4_int8.ideogram4 import synthetic
    from safetensors.torch import save_file

    cfg = _config()
    seed = int.from_bytes(os.urandom(3), "little")
    models = base / "models" / "diffusion_models"
    models.mkdir(parents=True)
    weights = {b: synthetic.RandomWeights(cfg, seed + i).materialize() for i, b in enumerate(BRANCHES)}
    synthetic.write_w8a8(models / WEIGHTS, weights, cfg)
    g = torch.Generator().manual_seed(seed)
    save_file({"cond": torch.randn(1, TEXT_TOKENS, cfg.llm_features_dim, generator=g)}, str(base / COND))


def expected_layers():
    """What the writer's defaults store: ({protected block linears}, {float top-level linears}, {W8A8 linears})."""
    from comfyui_ideogram4_int8.ideogram4.synthetic import default_protected

    cfg = _config()
    protected = set(default_protected(cfg))
    w8a8 = set(cfg.default_quantized()) - protected
    top = set(cfg.linear_names()) - protected - w8a8
    return protected, top, w8a8


@contextlib.contextmanager
def panel_server(env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
    """A real ComfyUI with the pack, the test pack and the synthetic files (``args``: more of ComfyUI's command-line
    options); stopped on exit."""
    from comfyui_server import WITH_TEST_PACK, ComfyUIServer, started

    server = ComfyUIServer(packs=WITH_TEST_PACK, setup=setup_files, env={**CLEAN_ENV, **(env or {})}, args=args)
    with started(server, remove_base=True):
        yield server


def prompt(server, gemm_path: str = "auto", seed: int = 7) -> dict:
    """Loader -> Sampler (text features from the test pack's node) -> SaveLatent, in ComfyUI's API format."""
    return {
        LOADER: {
            "class_type": "Ideogram4Int8Loader",
            "inputs": {
                "weights": WEIGHTS,
                "unconditional_weights": "(second branch of the weights file)",
                "base": "none",
                "unconditional_base": "none",
                "compute_dtype": "auto",
                "gemm_path": gemm_path,
            },
        },
        CONDITIONING: {"class_type": "Ideogram4TestConditioning", "inputs": {"path": str(server.base / COND)}},
        SAMPLER: {
            "class_type": "Ideogram4Int8Sampler",
            "inputs": {
                "model": [LOADER, 0],
                "model_negative": [LOADER, 1],
                "positive": [CONDITIONING, 0],
                "seed": seed,
                "preset": "custom",
                "width": SIZE,
                "height": SIZE,
                "batch_size": 1,
                "steps": STEPS,
                "guidance": 7.0,
                "polish_steps": 1,
                "polish_guidance": 3.0,
                "mu": 0.0,
                "std": 1.75,
            },
        },
        SAVE: {"class_type": "SaveLatent", "inputs": {"samples": [SAMPLER, 0], "filename_prefix": "panel"}},
    }


def get(server, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def post(server, path: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class WebSocket:
    """Just enough of RFC 6455 to read ComfyUI's text frames (server frames are unmasked)."""

    def __init__(self, base_url: str, client_id: str):
        host, port = base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("websocket closed")
            buf += chunk
        return buf

    def messages(self, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.sock.settimeout(max(0.1, deadline - time.time()))
            try:
                b0, b1 = self._read(2)
            except TimeoutError:
                return
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            if b0 & 0x0F == 1:  # text frame (binary frames are previews)
                yield json.loads(payload)

    def close(self):
        self.sock.close()


def validate(report):
    jsonschema.validate(report, status.load_schema(), cls=jsonschema.Draft202012Validator)


def run_prompt(server, graph: dict, timeout: float = 300) -> list[dict]:
    """Queue ``graph``, wait for it to finish; the pack's websocket events in the order they came."""
    client_id = uuid.uuid4().hex
    ws = WebSocket(server.url, client_id)
    try:
        code, body = post(server, "/prompt", {"prompt": graph, "client_id": client_id})
        assert code == 200, body
        prompt_id = body["prompt_id"]
        events = []
        for msg in ws.messages(timeout):
            if msg.get("type") == status.EVENT:
                events.append(msg["data"])
            if msg.get("type") == "execution_success" and msg["data"].get("prompt_id") == prompt_id:
                return events
            if msg.get("type") == "execution_error":
                pytest.fail(f"the prompt failed: {json.dumps(msg['data'])[:3000]}\n{server.log_tail()}")
        pytest.fail(f"no execution_success within {timeout} s; events so far: {events}\n{server.log_tail()}")
    finally:
        ws.close()


def check_layers(model: dict, quant_path: str, quant_reason) -> None:
    """Every linear of one model in the report: W8A8 ones on ``quant_path``, float ones ``bf16`` with their reason."""
    protected, top, w8a8 = expected_layers()
    rows = {r["layer"]: r for r in model["layers"]}
    assert set(rows) == protected | top | w8a8, sorted(set(rows) ^ (protected | top | w8a8))
    for name, row in rows.items():
        if name in model.get("idle", {}):
            # the image-only unconditional pass never runs its text projection: idle by design, said so as its why
            assert (model["role"], name, row["calls"]) == ("unconditional", "llm_cond_proj", 0), row
            assert row["path"] == quant_path and row["reason"] == model["idle"][name] == status.IMAGE_ONLY_WHY, row
            continue
        if name in w8a8:
            assert row["path"] == quant_path, row
            # layers whose SmoothQuant divide could not be folded at load say so after the path's reason
            reason, _, note = row["reason"].partition("; SmoothQuant divide at run time: ")
            assert not note or name.endswith(
                (
                    "adaln_modulation",
                    "t_embedding.mlp_out",
                    "final_layer.linear",
                    "input_proj",
                    "adaln_proj",
                    "t_embedding.mlp_in",
                )
            ), row
            if name.endswith(("feed_forward.w1", "feed_forward.w3")):
                # w1 and w3 carry different SmoothQuant vectors in the file; the load folds one shared vector into
                # ffn_norm1, so the pair runs as one call with one activation quantization
                assert row["fusion"].startswith("gate/up pair: "), row
            else:
                assert row["fusion"] is None, row
            assert quant_reason(reason), row
        else:
            assert row["path"] == "bf16", row
            assert row["reason"] == (REASON_PROTECTED if name in protected else REASON_TOP), row
    counts = dict.fromkeys(PATHS, 0)
    counts[quant_path], counts["bf16"] = len(w8a8), len(protected | top)
    assert model["counts"] == counts
    # the sampler ran every step through both branches; the image-only unconditional pass has no text to project
    for name, row in rows.items():
        ran = not (model["role"] == "unconditional" and name == "llm_cond_proj")
        assert row["calls"] == (STEPS if ran else 0), row
    assert model["layers_run"] == len(rows) - (model["role"] == "unconditional")


def check_events(events: list[dict]) -> None:
    """One push after the load (the loader's node id) and one after the run (the sampler's)."""
    assert [(e["event"], e["node_id"], e["models"]) for e in events] == [
        ("load", LOADER, BRANCHES),
        ("run", SAMPLER, BRANCHES),
    ]
    for e in events:
        validate(e["report"])
        assert all(m["layers"] is None for m in e["report"]["models"])  # the push leaves the table to the route


def test_route_push_and_the_path_that_ran_then_a_forced_fallback(tmp_path):
    with panel_server() as server:
        # nothing has run: a clear message, schema-valid, under both mounts
        code, idle = get(server, "/ideogram4_int8/status")
        assert code == 200, idle
        validate(idle)
        assert idle["status"]["code"] == "no_models_yet" and idle["models"] == []
        assert get(server, "/api/ideogram4_int8/status?layers=0")[0] == 200
        # bad parameters: 400 with a JSON error naming the parameter, never a traceback
        for query, param in (("?layers=maybe", "layers"), ("?bogus=1", "bogus"), ("?model=a&model=b", "model")):
            code, body = get(server, "/ideogram4_int8/status" + query)
            assert code == 400 and body["parameter"] == param, (query, code, body)
            assert "Traceback" not in json.dumps(body)
        code, body = get(server, "/ideogram4_int8/status?model=conditional")
        assert code == 404 and body["parameter"] == "model"
        assert post(server, "/ideogram4_int8/timing", b"{not json")[0] == 400

        # 1. the automatic path: on this CPU server cuBLAS INT8 (torch._int_mm), with the reason
        events = run_prompt(server, prompt(server))
        check_events(events)
        # the load push lists the models before they ran (declared, 0 calls); the run push after sampling
        load_report, run_report = events[0]["report"], events[1]["report"]
        assert [m["layers_run"] for m in load_report["models"]] == [0, 0]
        assert all(m["layers_run"] > 0 for m in run_report["models"])
        code, auto = get(server, "/ideogram4_int8/status")
        assert code == 200
        validate(auto)
        assert [(m["label"], m["role"]) for m in auto["models"]] == [(b, b) for b in BRANCHES]
        cpu = not auto["environment"]["cuda_available"]
        assert cpu, "this test expects the CPU server the harness starts (--cpu)"
        assert auto["status"]["code"] == "no_cuda" and "No CUDA GPU" in auto["status"]["message"]
        assert auto["environment"]["forced_path"]["value"] is None
        for m in auto["models"]:
            check_layers(m, "cublas-int8", lambda reason: "the fused Triton kernel needs a CUDA GPU" in reason)
            assert m["counts_run"]["dequant-bf16"] == 0
        text = json.dumps(auto)
        assert str(tmp_path) not in text and str(ROOT) not in text and str(server.base) not in text

        # 2. the same graph with the loader's gemm_path forced to the phantom-INT8 fallback: the loader runs
        #    again, and the report holds the new path only (nothing left from the first run)
        events = run_prompt(server, prompt(server, gemm_path="dequant-bf16"))
        check_events(events)
        code, forced = get(server, "/ideogram4_int8/status")
        assert code == 200
        validate(forced)
        assert [m["label"] for m in forced["models"]] == BRANCHES
        for m in forced["models"]:
            check_layers(m, "dequant-bf16", lambda reason: reason == "forced by path argument")
        code, one = get(server, "/ideogram4_int8/status?model=unconditional&layers=0")
        assert code == 200 and [m["label"] for m in one["models"]] == ["unconditional"]
        assert one["models"][0]["layers"] is None and one["models"][0]["counts"]["dequant-bf16"] > 0


def test_forced_dequant_by_environment_and_timing_switch(tmp_path):
    env = {"IDEOGRAM4_INT8_GEMM_PATH": "dequant-bf16", "IDEOGRAM4_INT8_GEMM_TIMING": "1"}
    with panel_server(env) as server:
        check_events(run_prompt(server, prompt(server)))
        code, report = get(server, "/ideogram4_int8/status")
        assert code == 200
        validate(report)
        for m in report["models"]:
            check_layers(m, "dequant-bf16", lambda reason: reason == "forced by IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16")
        assert report["environment"]["forced_path"] == {
            "variable": "IDEOGRAM4_INT8_GEMM_PATH",
            "value": "dequant-bf16",
            "valid": True,
        }
        assert any("IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16" in n for n in report["status"]["notes"])
        # timing switched on by the environment; CPU GEMMs are not timed, and the report says so
        assert report["timing"]["enabled"] is True and report["timing"]["switched_by"] == "env"
        assert report["timing"]["last_run"] is None and "not timed" in report["timing"]["note"]
        # the panel setting switches it off again through the route
        assert post(server, "/ideogram4_int8/timing", {"enabled": False}) == (
            200,
            {"enabled": False, "switched_by": "setting"},
        )
        timing = get(server, "/ideogram4_int8/status?layers=0")[1]["timing"]
        assert timing["enabled"] is False and timing["switched_by"] == "setting"
