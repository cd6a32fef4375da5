"""Models by Hugging Face Hub name: ``Engine.from_pretrained(repo_id,
filename)``. Downloads and the cache are ``huggingface_hub``'s own (the
optional ``oxillama[hub]`` extra); a snapshot of a hub-loaded engine records
the repo, the commit and the file, so a restore on another machine finds the
model through that machine's hub cache."""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxillama.errors import LoadError

__all__ = ["HF_HELP", "HubRef", "add_hf_arg", "download", "locate"]

_GLOB = re.compile(r"[*?\[]")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
INSTALL_HINT = "pip install 'oxillama[hub]'"


@dataclass(frozen=True)
class HubRef:
    """Where a model file came from: ``revision`` is the commit hash the
    requested revision resolved to, so the same bytes can be found again."""

    repo_id: str
    revision: str
    filename: str

    def to_dict(self) -> dict[str, str]:
        return {"repo_id": self.repo_id, "revision": self.revision, "filename": self.filename}

    @classmethod
    def from_dict(cls, d: Any) -> HubRef | None:
        if not isinstance(d, dict):
            return None
        repo, rev, name = (d.get(k) for k in ("repo_id", "revision", "filename"))
        if not (isinstance(repo, str) and isinstance(rev, str) and isinstance(name, str)):
            return None
        if not (repo and rev and name):
            return None
        return cls(repo, rev, name)


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants  # a submodule its lazy loader does not expose
    except ImportError:
        raise LoadError(
            f"loading a model by hub name needs huggingface_hub: {INSTALL_HINT}"
        ) from None
    return huggingface_hub


def _offline(hub: Any) -> bool:
    env = os.environ.get("HF_HUB_OFFLINE", "").upper()
    return bool(hub.constants.HF_HUB_OFFLINE) or env in ("1", "ON", "YES", "TRUE")


def _cache_root(hub: Any, cache_dir: str | os.PathLike[str] | None) -> Path:
    """``cache_dir``, else the hub cache the environment names now
    (``huggingface_hub`` reads it once, when first imported)."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(hub.constants.HF_HUB_CACHE)


def _cached_files(hub: Any, repo_id: str, revision: str | None, cache_dir: Any) -> list[str]:
    """The files of ``revision`` in the local cache (``models--ORG--NAME``,
    ``refs/<revision>`` naming a ``snapshots/<commit>`` folder)."""
    repo = _cache_root(hub, cache_dir) / ("models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    if not _COMMIT.match(rev):
        ref = repo / "refs" / rev
        if not ref.is_file():
            raise LoadError(
                f"{repo_id}@{rev} is not in the hub cache {repo.parent} and the hub is "
                "offline (HF_HUB_OFFLINE)"
            )
        rev = ref.read_text().strip()
    snap = repo / "snapshots" / rev
    if not snap.is_dir():
        raise LoadError(f"{repo_id}@{rev} is not in the hub cache {repo.parent}")
    return sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if not p.is_dir())


def _match(hub: Any, repo_id: str, pattern: str, revision: str | None, cache_dir: Any) -> str:
    if not _GLOB.search(pattern):
        return pattern
    if _offline(hub):
        files = _cached_files(hub, repo_id, revision, cache_dir)
    else:
        try:
            files = hub.HfApi().list_repo_files(repo_id, revision=revision)
        except Exception as e:  # the hub's errors: not found, gated, network
            raise LoadError(f"cannot list the files of {repo_id}: {e}") from e
    hits = [f for f in files if fnmatch.fnmatchcase(f, pattern)]
    if len(hits) != 1:
        shown = ", ".join(files[:50]) + (" ..." if len(files) > 50 else "")
        what = "no file" if not hits else f"{len(hits)} files ({', '.join(hits)})"
        raise LoadError(
            f"{pattern!r} matches {what} in {repo_id}; it must match exactly one. "
            f"Files: {shown or 'none'}"
        )
    return hits[0]


def _commit_of(path: str, filename: str) -> str:
    # hf_hub_download answers .../snapshots/<commit>/<filename>.
    parts = Path(path).parts
    n = len(Path(filename).parts)
    if len(parts) > n + 1 and parts[-n - 2] == "snapshots":
        return parts[-n - 1]
    raise LoadError(f"the hub cache gave an unexpected path for {filename}: {path}")


def _fetch(
    hub: Any, repo_id: str, filename: str, revision: str | None, cache_dir: Any
) -> tuple[Path, HubRef]:
    try:
        path = hub.hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            cache_dir=_cache_root(hub, cache_dir),
            local_files_only=_offline(hub),
        )
    except Exception as e:  # not found, gated, offline without the file, network
        raise LoadError(f"cannot get {filename} from {repo_id}: {e}") from e
    return Path(path), HubRef(repo_id, _commit_of(str(path), filename), filename)


def download(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Path, HubRef]:
    """The local path of ``filename`` (a name or a glob matching exactly
    one file) in ``repo_id`` at ``revision``, downloading it into the hub
    cache unless it is there or the hub is offline."""
    if not isinstance(repo_id, str) or not repo_id or not isinstance(filename, str):
        raise LoadError(
            f"a hub model needs a repo id and a file name, got {repo_id!r}, {filename!r}"
        )
    hub = _hub()
    name = _match(hub, repo_id, filename, revision, cache_dir)
    return _fetch(hub, repo_id, name, revision, cache_dir)


def locate(ref: HubRef, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The file ``ref`` names, at its recorded commit, from this machine's
    hub cache (downloaded when the hub is reachable and allowed)."""
    return _fetch(_hub(), ref.repo_id, ref.filename, ref.revision, cache_dir)[0]


# The command-line flag that names a Hub file (``oxillama generate`` and
# ``oxillama serve`` both take it).
HF_HELP = (
    "a GGUF from the Hugging Face Hub instead of --model: REPO or REPO:FILE, FILE a name or "
    "a glob matching exactly one file (default *.gguf); uses huggingface_hub's cache "
    "(HF_HUB_OFFLINE=1: the cache only). Needs: pip install 'oxillama[hub]'"
)


def add_hf_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", metavar="REPO[:FILE]", help=HF_HELP)
