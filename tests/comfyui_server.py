"""Start a real ComfyUI with this pack, wait until it serves, talk to it, stop it.

Reusable by every ``@pytest.mark.comfyui`` test::

    from comfyui_server import ComfyUIServer, shared_server

    with ComfyUIServer() as srv:          # a private server
        info = srv.object_info("Ideogram4Int8CaptionBuilder")
    srv = shared_server()                 # one server per pytest process, stopped at exit

Environment:
  COMFYUI_DIR      a ComfyUI checkout (required; tests skip without it). It is never modified: the pack is
                   linked into a temporary ``--base-directory`` (custom_nodes, user, input, output, temp).
  COMFYUI_PYTHON   interpreter to run it (default: $COMFYUI_DIR/.venv/bin/python, else this interpreter).
  COMFYUI_ARGS     extra command-line arguments (shell-split), e.g. "--disable-cuda-malloc".
  COMFYUI_KEEP_BASE  set to keep the temporary base directory (``comfyui-base-*``, with ``comfyui.log``) after
                   ``stop()``; by default it is removed.
Only loopback is used; the port is a free one picked at start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

PACK_ROOT = pathlib.Path(__file__).resolve().parents[1]
PACK_NAME = "comfyui_ideogram4_int8"
TEST_PACK = PACK_ROOT / "tests" / "comfy_test_pack"  # test-only nodes (text features from a file, ...)
WITH_TEST_PACK = {PACK_NAME: PACK_ROOT, "ideogram4_test_pack": TEST_PACK}  # ``packs`` for this pack + the test pack


def comfyui_dir() -> pathlib.Path | None:
    value = os.environ.get("COMFYUI_DIR")
    return pathlib.Path(value) if value else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyUIError(RuntimeError):
    pass


class ComfyUIServer:
    """One ComfyUI process with this pack (and optionally other packs) installed in a temporary base directory.

    Args:
        root: ComfyUI checkout (default ``$COMFYUI_DIR``).
        python: interpreter (default ``$COMFYUI_PYTHON``, then ``<root>/.venv/bin/python``, then this one).
        packs: custom node folders to link, name -> path (default: this pack).
        cpu: pass ``--cpu`` (the default; GPU tests pass False).
        args: extra ComfyUI arguments (``$COMFYUI_ARGS`` is appended).
        startup_timeout: seconds to wait for ``/system_stats``.
        setup: optional ``setup(base_dir)`` run after the base directory is made and before ComfyUI starts (e.g.
            to put model files into ``base_dir / "models" / ...``).
        env: environment changes for the server: ``{name: value}`` sets, ``{name: None}`` removes.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        python: str | None = None,
        packs: dict[str, str | os.PathLike] | None = None,
        cpu: bool = True,
        args: tuple[str, ...] = (),
        startup_timeout: float = 240.0,
        setup=None,
        env: dict[str, str | None] | None = None,
    ):
        self.root = pathlib.Path(root) if root else comfyui_dir()
        if self.root is None or not (self.root / "main.py").is_file():
            raise ComfyUIError(f"no ComfyUI checkout at {self.root!r}: set COMFYUI_DIR to a ComfyUI directory")
        venv_python = self.root / ".venv" / "bin" / "python"
        self.python = (
            python
            or os.environ.get("COMFYUI_PYTHON")
            or (str(venv_python) if venv_python.exists() else shutil.which("python3") or "python3")
        )
        self.packs = {PACK_NAME: PACK_ROOT} if packs is None else dict(packs)
        self.args = [*(["--cpu"] if cpu else []), *args, *shlex.split(os.environ.get("COMFYUI_ARGS", ""))]
        self.startup_timeout = startup_timeout
        self.setup = setup
        self.env = dict(env or {})
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.base: pathlib.Path | None = None
        self.log_path: pathlib.Path | None = None
        self._log = None
        self._final_log = ""

    # -- lifecycle ---------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ComfyUIServer:
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="comfyui-base-"))
        nodes = self.base / "custom_nodes"
        nodes.mkdir()
        for name, path in self.packs.items():
            (nodes / name).symlink_to(pathlib.Path(path).resolve(), target_is_directory=True)
        if self.setup is not None:
            self.setup(self.base)
        self.port = free_port()
        self.log_path = self.base / "comfyui.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [
            self.python,
            "main.py",
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--base-directory",
            str(self.base),
            "--disable-auto-launch",
            *self.args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # tests/conftest.py sets TRITON_INTERPRET=1 for this process's CPU kernel tests; a user's ComfyUI never has it
        env.pop("TRITON_INTERPRET", None)
        for name, value in self.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        self.proc = subprocess.Popen(
            cmd, cwd=self.root, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ComfyUIError(f"ComfyUI exited with {self.proc.returncode} during startup:\n{self.log_tail()}")
            try:
                self.get_json("/system_stats", timeout=2)
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.5)
        self.stop()
        raise ComfyUIError(f"ComfyUI did not answer within {self.startup_timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=15)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.base is not None and self.base.exists() and not os.environ.get("COMFYUI_KEEP_BASE"):
            self._final_log = self.log_text()  # kept for log_tail() after the folder is gone
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> ComfyUIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- logs --------------------------------------------------------------------------------------------------
    def log_text(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._final_log

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def import_failures(self) -> list[str]:
        """Log lines where ComfyUI reports a custom node folder that failed to import."""
        return [
            line for line in self.log_text().splitlines() if "IMPORT FAILED" in line or line.startswith("Cannot import")
        ]

    # -- HTTP --------------------------------------------------------------------------------------------------
    def get_json(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            return json.loads(resp.read())

    def post_json(self, path: str, data, timeout: float = 30):
        req = urllib.request.Request(
            self.url + path, data=json.dumps(data).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            raise ComfyUIError(f"POST {path} -> HTTP {exc.code}: {body}") from exc

    def object_info(self, node_id: str | None = None) -> dict:
        if node_id is None:
            return self.get_json("/object_info")
        return self.get_json(f"/object_info/{node_id}").get(node_id, {})

    def queue_prompt(self, prompt: dict) -> str:
        """Queue an API-format prompt; return its id (a rejected prompt raises with ComfyUI's reasons)."""
        out = self.post_json("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
        return out["prompt_id"]

    def wait_for_history(self, prompt_id: str, timeout: float = 120) -> dict:
        """The history entry of a finished prompt (``status.status_str`` is "success" or "error")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hist = self.get_json(f"/history/{prompt_id}")
            entry = hist.get(prompt_id)
            if (
                entry
                and entry.get("status", {}).get("completed") is not None
                and (entry["status"].get("completed") or entry["status"].get("status_str") == "error")
            ):
                return entry
            if self.proc is not None and self.proc.poll() is not None:
                raise ComfyUIError(f"ComfyUI died while running {prompt_id}:\n{self.log_tail()}")
            time.sleep(0.2)
        raise ComfyUIError(f"prompt {prompt_id} did not finish within {timeout:.0f}s:\n{self.log_tail()}")

    def run_prompt(self, prompt: dict, timeout: float = 120) -> dict:
        return self.wait_for_history(self.queue_prompt(prompt), timeout)


@contextlib.contextmanager
def started(server: ComfyUIServer, remove_base: bool = False):
    """``server`` started, every custom node folder in it imported (asserted, with the log's tail); stopped on exit,
    and (``remove_base``) its temporary base directory removed even with ``COMFYUI_KEEP_BASE``."""
    server.start()
    try:
        assert server.import_failures() == [], server.log_tail()
        yield server
    finally:
        server.stop()
        if remove_base:
            shutil.rmtree(server.base, ignore_errors=True)


_SHARED: ComfyUIServer | None = None


def shared_server() -> ComfyUIServer:
    """One server per test process (started on first use, stopped at interpreter exit)."""
    global _SHARED
    if _SHARED is None or _SHARED.proc is None or _SHARED.proc.poll() is not None:
        _SHARED = ComfyUIServer().start()
        atexit.register(_SHARED.stop)
    return _SHARED


def history_errors(entry: dict) -> list[str]:
    """Readable execution errors from a history entry's status messages."""
    out = []
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_error":
            out.append(f"{data.get('node_type')} #{data.get('node_id')}: {data.get('exception_message')}")
    return out


if __name__ == "__main__":  # manual use: start a server with the pack and keep it running
    import sys

    root = comfyui_dir()
    if root is None or not (root / "main.py").is_file():
        print(
            "usage: COMFYUI_DIR=<a ComfyUI checkout> [COMFYUI_PYTHON=<its python>] python tests/comfyui_server.py "
            "[ComfyUI arguments ...]",
            file=sys.stderr,
        )
        sys.exit(2)
    srv = ComfyUIServer(args=tuple(sys.argv[1:])).start()
    print(f"ComfyUI with {PACK_NAME} at {srv.url} (log: {srv.log_path}); Ctrl-C stops it", flush=True)
    try:
        srv.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
