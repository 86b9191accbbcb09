"""Explicit Hugging Face hub downloads: ``hf://<owner>/<repo>/<path/in/repo>``.

Nothing is downloaded unless a path uses the ``hf://`` scheme. The token comes from the
environment (``HF_TOKEN``) or ``hf auth login`` through huggingface_hub itself; it is never
passed around, logged or written by this pack. ``HF_HUB_OFFLINE=1`` is respected: a cached file
is used, a missing one is an error that says so.
"""

from __future__ import annotations

import os
import pathlib

from .errors import HubError

SCHEME = "hf://"


def parse_hub_url(url: str) -> tuple[str, str, str | None]:
    """'hf://owner/repo/file.safetensors[@rev]' -> (repo_id, filename, revision)."""
    rest = url[len(SCHEME) :]
    revision = None
    if "@" in rest:
        rest, revision = rest.rsplit("@", 1)
    parts = [p for p in rest.split("/") if p]
    if len(parts) < 3:
        raise HubError(
            "a hub path needs an owner, a repository and a file",
            file=url,
            expected="hf://<owner>/<repo>/<file.safetensors>",
            found=url,
        )
    return "/".join(parts[:2]), "/".join(parts[2:]), revision


def resolve(
    path: str | os.PathLike,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> pathlib.Path:
    """A local path as given; an ``hf://`` URL downloaded (or taken from the cache)."""
    text = os.fspath(path)
    if not text.startswith(SCHEME):
        return pathlib.Path(text).expanduser()
    repo_id, filename, url_rev = parse_hub_url(text)
    return download(repo_id, filename, revision=revision or url_rev, cache_dir=cache_dir)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download(
    repo_id: str, filename: str, *, revision: str | None = None, cache_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """hf_hub_download with messages a ComfyUI user can act on. Never touches the token."""
    try:
        import huggingface_hub
        from huggingface_hub import utils as hf_errors  # these names live here in every version >= 0.23
    except ImportError:  # pragma: no cover - a declared dependency
        raise HubError(
            "huggingface_hub is not installed", file=f"{SCHEME}{repo_id}/{filename}", fix="pip install huggingface_hub"
        ) from None
    where = f"{SCHEME}{repo_id}/{filename}"
    try:
        local = huggingface_hub.hf_hub_download(
            repo_id=repo_id,
            filename=filename,
            revision=revision,
            cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        )
    except hf_errors.GatedRepoError:
        raise HubError(
            "the repository is gated",
            file=where,
            fix=f"accept its terms at https://huggingface.co/{repo_id}, then log in (`hf auth login`) or set HF_TOKEN",
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise HubError(
            "repository not found (or private and no valid token)",
            file=where,
            fix="check the repo id; for a private or gated repo log in (`hf auth login`) or set HF_TOKEN",
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise HubError(
            "revision not found", file=where, found=revision, fix="check the revision / branch name"
        ) from None
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled) as exc:
        if _offline():
            raise HubError(
                "HF_HUB_OFFLINE is set and the file is not in the local cache",
                file=where,
                fix="download it once with network access, or unset HF_HUB_OFFLINE",
            ) from None
        raise HubError(
            f"download failed and the file is not cached ({type(exc).__name__})",
            file=where,
            fix="check the network connection",
        ) from None
    except hf_errors.EntryNotFoundError:
        raise HubError("the repository has no such file", file=where, fix="check the file name") from None
    except hf_errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        raise HubError(
            f"the hub answered HTTP {status}",
            file=where,
            fix="retry later; for 401/403 log in (`hf auth login`) or set HF_TOKEN",
        ) from None
    return pathlib.Path(local)
