"""Rebuild example workflows in a real ComfyUI (developer tool, not a test).

    source /work/comfy-env.sh   # or: COMFYUI_DIR, COMFYUI_PYTHON, CHROMIUM, NODE_PATH, COMFYUI_NEWEST_FRONTEND_ROOT
    .venv/bin/python tests/browser/regenerate_workflows.py [<name> ...] [--out <dir>]

Starts the two ComfyUI servers ``build_example_workflows.mjs`` needs, both with the pack, the test pack and the example
model stand-ins (``tests/workflow_models.py``; the same server as ``tests/comfyui/test_example_workflows_comfyui.py``):
one on the frontend ComfyUI pins (1.49.6 for 0.33), where the files are built, and one with ``--front-end-root
$COMFYUI_NEWEST_FRONTEND_ROOT`` for the Nodes 2.0 layout pass. Then runs the builder for the named workflows (all of
them when none is named: name only the ones that changed, so the others stay byte for byte) into ``example_workflows/``
(or ``--out``), and stops both servers.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import tomllib

TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from workflow_checks import TEMPLATES  # noqa: E402
from workflow_models import example_server  # noqa: E402

BUILDER = TESTS / "browser" / "build_example_workflows.mjs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="workflows to build (keys of TEMPLATES); none: every one")
    parser.add_argument("--out", default=str(ROOT / "example_workflows"), help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model stand-ins (they are never run)")
    opts = parser.parse_args(argv)
    newest = os.environ.get("COMFYUI_NEWEST_FRONTEND_ROOT")
    if not newest or not (pathlib.Path(newest) / "index.html").is_file():
        parser.error("set COMFYUI_NEWEST_FRONTEND_ROOT to the static/ folder of an unpacked comfyui-frontend-package")
    # what tests/conftest.py gives the test servers' environment (the builder runs no prompt, but the pack imports)
    os.environ.setdefault("IDEOGRAM4_INT8_EXPERIMENTS", "cpu-gemm=int8")
    pinned = example_server(True, opts.seed)
    nodes2 = example_server(True, opts.seed, args=("--front-end-root", newest))
    try:
        for server in (pinned, nodes2):
            server.start()
            failures = server.import_failures()
            if failures:
                raise SystemExit(f"ComfyUI could not import {failures}:\n{server.log_tail()}")
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        # the registry id (ComfyUI's registry takes pyproject's [project] name) and version the nodes' cnr_id / ver
        # carry, and the file title of each workflow
        meta = {"pack": {"id": project["name"], "version": project["version"]}, "titles": TEMPLATES}
        cmd = ["node", str(BUILDER), pinned.url, opts.out, "--nodes2", nodes2.url, "--meta", json.dumps(meta)]
        cmd += opts.names
        print("+", " ".join(cmd), flush=True)
        return subprocess.run(cmd, cwd=ROOT, check=False).returncode
    finally:
        nodes2.stop()
        pinned.stop()


if __name__ == "__main__":
    sys.exit(main())
