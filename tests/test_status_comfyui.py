"""The GEMM-status route and websocket event in a real ComfyUI 0.33 (marked ``comfyui``).

Skipped without ``COMFYUI_DIR`` (a ComfyUI checkout, see ../shared/comfyui-local.md). The server
runs with ``--base-directory`` set to a temporary folder whose ``custom_nodes`` links this pack
and the test-only probe node (tests/comfyui_nodes/ig4i8_panel_probe), so nothing is written into
``COMFYUI_DIR``. Python: ``COMFYUI_PYTHON``, else ``$COMFYUI_DIR/.venv/bin/python``, else this one.

Until the loader / sampler nodes land the probe node stands in for them (a toy W8A8 checkpoint
through the real kernels, then ``publish``); switching means posting a loader + sampler prompt in
``_run_probe`` instead.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import jsonschema
import pytest
from comfyui_ideogram4_int8.kernels import status

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "comfyui_nodes" / "ig4i8_panel_probe"


def _python(comfy: pathlib.Path) -> str:
    if os.environ.get("COMFYUI_PYTHON"):
        return os.environ["COMFYUI_PYTHON"]
    venv = comfy / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Comfy:
    def __init__(self, base_url: str, proc: subprocess.Popen, log: pathlib.Path):
        self.base, self.proc, self.log = base_url, proc, log

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def post(self, path: str, body) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def comfyui(tmp_path: pathlib.Path, env: dict[str, str] | None = None):
    comfy = pathlib.Path(os.environ["COMFYUI_DIR"])
    base = tmp_path / "comfy-base"
    nodes = base / "custom_nodes"
    nodes.mkdir(parents=True)
    (base / "user").mkdir()
    (nodes / "comfyui_ideogram4_int8").symlink_to(ROOT, target_is_directory=True)
    (nodes / "ig4i8_panel_probe").symlink_to(PROBE, target_is_directory=True)
    port = _free_port()
    log = tmp_path / "comfyui.log"
    # conftest sets TRITON_INTERPRET=1 for the CPU tests; a user's ComfyUI never has it
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("IDEOGRAM4_INT8_") and k != "TRITON_INTERPRET"}
    run_env.update(env or {})
    cmd = [_python(comfy), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
           "--base-directory", str(base), "--disable-auto-launch"]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=comfy, stdout=out, stderr=subprocess.STDOUT, env=run_env)
    server = Comfy(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                if server.get("/system_stats")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"ComfyUI did not answer within 180 s:\n{server.log_tail()}")
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


class WebSocket:
    """Just enough of RFC 6455 to read ComfyUI's text frames (server frames are unmasked)."""

    def __init__(self, base_url: str, client_id: str):
        host, port = base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
             f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()
        )  # fmt: skip
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


def _run_probe(server: Comfy, client_id: str, steps: int = 2) -> str:
    prompt = {"1": {"class_type": "Ideogram4Int8PanelProbeSampler", "inputs": {"steps": steps, "seed": 5}}}
    code, body = server.post("/prompt", {"prompt": prompt, "client_id": client_id})
    assert code == 200, body
    return body["prompt_id"]


def _wait_events(ws: WebSocket, prompt_id: str, timeout: float = 120) -> list[dict]:
    events = []
    for msg in ws.messages(timeout):
        if msg.get("type") == status.EVENT:
            events.append(msg["data"])
        if msg.get("type") == "execution_success" and msg["data"].get("prompt_id") == prompt_id:
            return events
        if msg.get("type") == "execution_error":
            pytest.fail(f"the probe prompt failed: {json.dumps(msg['data'])[:2000]}")
    pytest.fail(f"no execution_success within {timeout} s; events so far: {events}")


def test_route_push_and_automatic_path(tmp_path):
    with comfyui(tmp_path) as server:
        # nothing has run: a clear message, schema-valid, under both mounts
        code, idle = server.get("/ideogram4_int8/status")
        assert code == 200, idle
        validate(idle)
        assert idle["status"]["code"] == "no_models_yet" and idle["models"] == []
        assert server.get("/api/ideogram4_int8/status?layers=0")[0] == 200
        # bad parameters: 400 with a JSON error naming the parameter, never a traceback
        for query, param in (("?layers=maybe", "layers"), ("?bogus=1", "bogus"), ("?model=a&model=b", "model")):
            code, body = server.get("/ideogram4_int8/status" + query)
            assert code == 400 and body["parameter"] == param, (query, code, body)
            assert "Traceback" not in json.dumps(body)
        code, body = server.get("/ideogram4_int8/status?model=conditional")
        assert code == 404 and body["parameter"] == "model"
        assert server.post("/ideogram4_int8/timing", b"{not json")[0] == 400

        client_id = uuid.uuid4().hex
        ws = WebSocket(server.base, client_id)
        try:
            prompt_id = _run_probe(server, client_id)
            events = _wait_events(ws, prompt_id)
        finally:
            ws.close()
        assert [e["event"] for e in events] == ["load", "run"], events
        assert events[-1]["node_id"] == "1" and events[-1]["models"] == ["conditional", "unconditional"]
        validate(events[-1]["report"])

        code, report = server.get("/ideogram4_int8/status")
        assert code == 200
        validate(report)
        assert [m["label"] for m in report["models"]] == ["conditional", "unconditional"]
        for m in report["models"]:
            # a CPU server: the automatic path is cuBLAS INT8 (torch._int_mm), said and explained
            quant = [r for r in m["layers"] if r["path"] != "bf16"]
            assert quant and all(r["path"] == "cublas-int8" for r in quant)
            assert all("CUDA GPU" in r["reason"] for r in quant)
            assert m["counts"]["bf16"] == len(m["layers"]) - len(quant) > 0
            assert all(r["calls"] == 2 for r in m["layers"])
        if not report["environment"]["cuda_available"]:
            assert report["status"]["code"] == "no_cuda"
        text = json.dumps(report)
        assert str(tmp_path) not in text and str(ROOT) not in text


def test_forced_dequant_path_shows_up(tmp_path):
    env = {"IDEOGRAM4_INT8_GEMM_PATH": "dequant-bf16", "IDEOGRAM4_INT8_GEMM_TIMING": "1"}
    with comfyui(tmp_path, env=env) as server:
        client_id = uuid.uuid4().hex
        ws = WebSocket(server.base, client_id)
        try:
            _wait_events(ws, _run_probe(server, client_id, steps=1))
        finally:
            ws.close()
        code, report = server.get("/ideogram4_int8/status?model=unconditional")
        assert code == 200
        validate(report)
        (m,) = report["models"]
        assert m["counts"]["dequant-bf16"] == len(m["layers"]) - m["counts"]["bf16"] > 0
        assert m["counts"]["cublas-int8"] == m["counts"]["triton-int8"] == 0
        assert {r["reason"] for r in m["layers"] if r["path"] == "dequant-bf16"} == {
            "forced by IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16"
        }
        assert report["environment"]["forced_path"]["valid"] is True
        # timing switched on by the environment; CPU GEMMs are not timed, and the report says so
        assert report["timing"]["enabled"] is True and report["timing"]["switched_by"] == "env"
        if not report["environment"]["cuda_available"]:
            assert report["timing"]["last_run"] is None and "not timed" in report["timing"]["note"]
