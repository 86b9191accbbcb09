"""Hub downloads: only on an explicit hf:// path, offline mode respected, the token never shown."""

from __future__ import annotations

import logging
import shutil
import socket
import types

import huggingface_hub
import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import hub
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.errors import HubError, NotSafetensorsError
from comfyui_ideogram4_int8.ideogram4.synthetic import write_w8a8
from huggingface_hub import constants as hf_constants
from huggingface_hub import utils as hf_utils
from ideogram4_checks import TINY, tiny_weights

SECRET = "hf_TESTSENTINELnotarealtoken0123456789"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_TOKEN", SECRET)


def test_local_paths_never_touch_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda **k: pytest.fail("hub called for a local path"))
    with pytest.raises(NotSafetensorsError, match="not found"):
        read_branch(tmp_path / "owner" / "repo" / "file.safetensors", "conditional")
    assert hub.resolve(str(tmp_path / "x.safetensors")) == tmp_path / "x.safetensors"


def test_hf_url_downloads_through_huggingface_hub(tmp_path, gen, monkeypatch):
    real = write_w8a8(tmp_path / "w8a8.safetensors", tiny_weights(gen), TINY)
    calls = []

    def fake_download(**kw):
        calls.append(kw)
        return str(real)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    sd = read_branch(
        "hf://transformerlab/ideogram-4-int8-w8a8/sub/w8a8.safetensors@v1", "conditional", cache_dir=tmp_path / "cache"
    )
    assert sd["layers.0.attention.qkv.weight"].dtype == torch.int8
    assert calls == [
        {
            "repo_id": "transformerlab/ideogram-4-int8-w8a8",
            "filename": "sub/w8a8.safetensors",
            "revision": "v1",
            "cache_dir": str(tmp_path / "cache"),
        }
    ]
    assert "token" not in calls[0]  # huggingface_hub finds HF_TOKEN / the login itself


@pytest.mark.parametrize(
    "exc_name, words",
    [
        ("GatedRepoError", ["gated", "https://huggingface.co/owner/repo", "HF_TOKEN"]),
        ("RepositoryNotFoundError", ["not found", "hf auth login"]),
        ("EntryNotFoundError", ["no such file"]),
    ],
)
def test_hub_errors_are_actionable_and_never_show_the_token(monkeypatch, caplog, exc_name, words):
    cls = getattr(hf_utils, exc_name)

    response = types.SimpleNamespace(headers={}, status_code=401, request=None, url="https://huggingface.co")

    def fail(**kw):
        if issubclass(cls, hf_utils.HfHubHTTPError):
            raise cls(f"401 for token {SECRET}", response=response)
        raise cls(f"401 for token {SECRET}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    with caplog.at_level(logging.DEBUG), pytest.raises(HubError) as ei:
        read_branch("hf://owner/repo/model.safetensors", "conditional")
    msg = str(ei.value)
    for w in words:
        assert w in msg
    assert "hf://owner/repo/model.safetensors" in msg
    assert SECRET not in msg and SECRET not in caplog.text
    assert ei.value.__cause__ is None  # the hub's message (which could echo headers) is not chained


def test_bad_hub_url():
    with pytest.raises(HubError, match="owner, a repository and a file"):
        hub.resolve("hf://owner/repo")


def _cached(cache, repo, filename, src):
    """Lay a file out the way huggingface_hub's cache stores it (refs/main -> snapshot)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = cache / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    shutil.copy(src, snap / filename)
    return snap / filename


def test_offline_mode_uses_the_cache_or_says_why(tmp_path, gen, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    cache = tmp_path / "cache"
    with pytest.raises(HubError) as ei:
        read_branch("hf://owner/repo/model.safetensors", "conditional", cache_dir=cache)
    assert "HF_HUB_OFFLINE" in str(ei.value) and "cache" in str(ei.value)
    src = write_w8a8(tmp_path / "w.safetensors", tiny_weights(gen), TINY)
    _cached(cache, "owner/repo", "model.safetensors", src)
    sd = read_branch("hf://owner/repo/model.safetensors", "unconditional", cache_dir=cache)
    assert sd.branch == "unconditional" and len(sd) > 0
