"""`Model`: a GGUF file's weights, tokenizer and chat template, loaded once
per process and shared by every engine and session that runs it."""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import Any

import oxillama._native as _native
from oxillama.errors import LoadError, ParameterError
from oxillama.model.gc_pause import gc_paused
from oxillama.model.hub import HubRef
from oxillama.model.hub import download as hub_download
from oxillama.model.offload import OffloadPolicy, check_policy, native_args
from oxillama.model.paths import resolve_model_path
from oxillama.model.rank_head import RankHead, is_reranker, load_head
from oxillama.text.chat_template import ChatTemplate
from oxillama.text.tokenizer import Tokenizer

__all__ = ["Model"]

#: The file's identity as the OS sees it: a file replaced or rewritten in
#: place gets a new key, so a stale model is never handed out for it.
_Key = tuple[str, int, int, int, int, str | None]

_CACHE: weakref.WeakValueDictionary[_Key, Model] = weakref.WeakValueDictionary()
#: One lock for the whole cache: two threads opening the same file at once
#: must not both load it (the second waits and gets the first's model).
_LOCK = threading.Lock()


def _key(path: Path, tokenizer_path: Path | None) -> _Key:
    st = os.stat(path)
    tok = None if tokenizer_path is None else os.path.realpath(tokenizer_path)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, tok)


class Model:
    """Weights (memory-mapped where the layout allows), tokenizer and chat
    template of one GGUF file.

    ``Model(path)`` returns the model this process already holds for that
    file when there is one (the cache is keyed by the file's identity:
    real path, device, inode, size and modification time, plus the
    tokenizer override) and loads it otherwise. The cache holds models
    weakly: the weights go when the last engine or session using them does.

    Pass a ``Model`` to :class:`~oxillama.Engine`,
    :class:`~oxillama.AsyncEngine` or :class:`~oxillama.SpeculativeEngine`
    to run many sessions on one copy of the weights; passing a path does
    the same through the cache.
    """

    model_path: Path | None
    tokenizer_path: Path | None
    metadata: dict[str, Any]
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    native: _native.Model
    #: A reranker's classifier head (a BERT with ``cls.*`` tensors, or with
    #: ``<arch>.pooling_type`` = rank), else None.
    rank_head: RankHead | None
    #: Where the file came from when loaded by hub name (recorded in snapshots).
    hub: HubRef | None
    _fingerprint: Any
    _offload: OffloadPolicy | None

    def __new__(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        tokenizer_path: str | os.PathLike[str] | None = None,
    ) -> Model:
        p = resolve_model_path(path)
        tok = Path(tokenizer_path) if tokenizer_path is not None else None
        try:
            key = _key(p, tok)
        except OSError as e:
            raise LoadError(f"cannot open model {str(p)!r}: {e}") from None
        with _LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                return hit
            self = cls._build(_native.GgufFile.open(str(p)), p, tok, None)
            _CACHE[key] = self
            return self

    @classmethod
    def from_bytes(
        cls, data: bytes | bytearray | memoryview, *, tokenizer_json: str | None = None
    ) -> Model:
        """A model from a GGUF image held in memory (``tokenizer_json`` is
        the text of a tokenizer.json that overrides the GGUF vocabulary).
        Not cached: there is no file to identify it by."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes, not {type(data).__name__}")
        return cls._build(_native.GgufFile.from_bytes(bytes(data)), None, None, tokenizer_json)

    @classmethod
    def _build(
        cls,
        gguf: _native.GgufFile,
        path: Path | None,
        tokenizer_path: Path | None,
        tokenizer_json: str | None,
    ) -> Model:
        with gc_paused():
            return cls._build_unpaused(gguf, path, tokenizer_path, tokenizer_json)

    @classmethod
    def _build_unpaused(
        cls,
        gguf: _native.GgufFile,
        path: Path | None,
        tokenizer_path: Path | None,
        tokenizer_json: str | None,
    ) -> Model:
        self = object.__new__(cls)
        self.model_path = path
        self.tokenizer_path = tokenizer_path
        self.metadata = gguf.metadata()
        self.native = _native.Model(gguf)
        if tokenizer_json is not None:
            self.tokenizer = Tokenizer.from_json_str(tokenizer_json, self.metadata)
        elif tokenizer_path is not None:
            self.tokenizer = Tokenizer.from_file(tokenizer_path, self.metadata)
        else:
            # Read just now from gguf and not yet shared: the same merges.
            self.tokenizer = Tokenizer.from_gguf_metadata(self.metadata, _file=gguf)
        if self.tokenizer.vocab_size > self.native.n_vocab:
            raise LoadError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but the model's "
                f"embedding has {self.native.n_vocab} rows"
            )
        self.chat_template = ChatTemplate.from_metadata(self.metadata)
        arch = str(self.native.arch)
        self.rank_head = (
            load_head(gguf, self.metadata, arch) if is_reranker(gguf, self.metadata, arch) else None
        )
        self.hub = None
        self._fingerprint = None
        self._offload = None
        return self

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str,
        *,
        revision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
    ) -> Model:
        """The GGUF ``filename`` of the Hugging Face Hub repo ``repo_id``
        (``filename`` may be a glob matching exactly one file), through
        ``huggingface_hub``'s cache (``pip install 'oxillama[hub]'``;
        ``HF_HUB_OFFLINE=1`` uses the cache only). Snapshots of engines on
        it record the repo, the commit and the file."""
        path, ref = hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir)
        model = cls(path, tokenizer_path=tokenizer_path)
        # A copy this process first opened by another path keeps that path
        # (and its snapshots reference it); only a model opened from the hub
        # cache is labelled with the hub's coordinates.
        if model.model_path == path:
            model.hub = ref
        return model

    @property
    def arch(self) -> str:
        return str(self.native.arch)

    @property
    def vocab_size(self) -> int:
        return int(self.native.n_vocab)

    @property
    def n_ctx_train(self) -> int:
        return int(self.native.n_ctx_train)

    @property
    def config(self) -> dict[str, Any]:
        """Hyper-parameters (layers, heads, dimensions, rope, vocabulary)."""
        return dict(self.native.config())

    @property
    def offload(self) -> OffloadPolicy | None:
        """The memory policy the weights run under (None: plainly mapped)."""
        return self._offload

    def set_offload(self, policy: OffloadPolicy | None) -> None:
        """Runs every engine and session on this model under ``policy``
        from now on (:class:`~oxillama.Budget`,
        :class:`~oxillama.PinnedHotSet`, or None for the plain mapping).
        A budget too small for the pinned set plus the largest layer is a
        :class:`~oxillama.ParameterError` naming the sizes."""
        policy = check_policy(policy)
        if policy is None:
            self.native.clear_offload()
        else:
            self.native.set_offload(*native_args(policy, int(self.config["n_layer"])))
        self._offload = policy

    def apply_offload(self, policy: OffloadPolicy | None) -> None:
        """What ``Engine(model, offload=policy)`` asks: None leaves the model
        as it is; a policy is applied unless the model already runs under a
        different one (other engines share it), which is an error."""
        policy = check_policy(policy)
        if policy is None or self.offload == policy:
            return
        if self.offload is not None:
            raise ParameterError(
                f"this process already runs {self.model_path} under offload={self.offload!r}; "
                f"one model has one policy (requested {policy!r}; Model.set_offload changes it "
                f"for every engine on it)"
            )
        self.set_offload(policy)

    def prepare(self, threads: int, *, wait: bool = False) -> None:
        """Starts building the weights' repacked layouts on a background
        thread of ``threads`` workers (once per model; not under an offload
        policy), so the first forward pass does not build them itself:
        engines call it when they are made, and their first request then
        finds the work done or under way. ``wait=True`` returns once they
        are built (what llama.cpp's loader does before it returns): a
        server that reports itself ready only then, or a benchmark that
        times requests and not the load."""
        if self._offload is None:
            self.native.prepare_weights(threads)
            if wait:
                self.native.wait_weights(threads)

    def offload_metrics(self) -> dict[str, int]:
        """The pager's counters as ``offload_*`` metrics; empty without a policy."""
        stats = self.native.offload_stats()
        if stats is None:
            return {}
        keys = (
            "budget",
            "pinned_bytes",
            "resident_bytes",
            "peak_resident_bytes",
            "layer_loads",
            "evictions",
            "bytes_read",
            "passes",
        )
        return {f"offload_{k}": int(stats[k]) for k in keys}

    def fingerprint(self, probe: int | None = None) -> Any:
        """The file's :class:`~oxillama.sessions.Fingerprint`: size and BLAKE3
        of its first and last ``probe`` bytes (8 MiB by default), computed
        once per probe size."""
        from oxillama.model.fingerprint import PROBE, cached_fingerprint

        if self.model_path is None:
            raise LoadError("a model loaded from bytes has no file to fingerprint")
        if probe is not None and probe != PROBE:
            return cached_fingerprint(self.model_path, probe)
        if self._fingerprint is None:
            self._fingerprint = cached_fingerprint(self.model_path)
        return self._fingerprint

    def __repr__(self) -> str:
        src = str(self.model_path) if self.model_path else "<bytes>"
        return f"Model({src!r}, arch={self.arch!r}, vocab_size={self.vocab_size})"
