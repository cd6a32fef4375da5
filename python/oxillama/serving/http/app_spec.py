"""What one server is made of: the model and the options of ``oxillama
serve``, in one picklable record. ``oxillama serve`` builds its app from
one; so does every Ray Serve replica (``oxillama.serving.ray``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.applications import Starlette

from oxillama.decoding.reasoning import ReasoningFormat
from oxillama.decoding.tool_calls import ToolFormat
from oxillama.model.model import Model
from oxillama.model.offload import OffloadPolicy
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.http.app import build_app
from oxillama.serving.http.auth import load_api_keys
from oxillama.serving.http.limits import Limits

__all__ = ["AppSpec"]


@dataclass(frozen=True)
class AppSpec:
    """The model (a GGUF path, a loaded :class:`Model`, or None for the
    default) and every server option.

    The API keys are read where the app is built (``api_keys``, the lines
    of ``api_key_file`` and that process's ``$OXILLAMA_API_KEY``), so a
    replica started elsewhere reads its own key file."""

    model: str | Model | None = None
    #: A Hugging Face Hub GGUF, ``repo`` or ``repo:file-glob`` (instead of
    #: ``model``): each process that builds the app fetches it.
    hf: str | None = None
    threads: int | None = None
    context_size: int = 2048
    max_batch: int = 8
    kv_pages: int | None = None
    #: KV cache types of keys and values ("f16", "q8_0", ...).
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    max_queue: int = 256
    offload: OffloadPolicy | None = None
    model_name: str | None = None
    sessions_dir: str | None = None
    api_keys: tuple[str, ...] = ()
    api_key_file: str | None = None
    metrics_auth: bool = False
    limits: Limits = field(default_factory=Limits)
    loras: Mapping[str, str] | None = None
    tool_format: ToolFormat | None = None
    #: ``--reasoning-format`` and ``--reasoning-budget``.
    reasoning_format: ReasoningFormat = "auto"
    reasoning_budget: int = -1
    speculative: str | None = None
    #: llama.cpp's context shift for sessions (``--context-shift --keep N``).
    context_shift: bool = False
    n_keep: int = 0
    #: Behind a router that routes sessions by ``X-Session-Id``: the session
    #: requests named in the body only are counted (they lose affinity).
    routed_by_session_header: bool = False
    #: The chat page at ``/`` (``--no-webui`` turns it off).
    webui: bool = True
    #: Tiers of the prefix store (``--kv-store``: folders, ``redis://``
    #: URLs; Ray replicas meet in a shared Redis) and the folder's bound.
    kv_store: tuple[str, ...] = ()
    kv_store_bytes: int | None = None
    #: ``--reranking``: serve /v1/rerank with a reranker model.
    reranking: bool = False

    def keys(self) -> tuple[str, ...]:
        return load_api_keys(self.api_keys, self.api_key_file)

    def build(self, keys: tuple[str, ...] | None = None) -> Starlette:
        """Loads the model and its repacked weights and returns the app
        (its ``state.server`` is the :class:`~oxillama.serving.http.app.Server`)."""
        model = self.model
        if self.hf is not None:
            repo, _, name = self.hf.partition(":")
            model = Model.from_pretrained(repo, name or "*.gguf")
        engine = AsyncEngine(
            model,
            context_size=self.context_size,
            threads=self.threads,
            max_batch=self.max_batch,
            kv_pages=self.kv_pages,
            kv_dtype_k=self.cache_type_k,
            kv_dtype_v=self.cache_type_v,
            max_queue=self.max_queue,
            loras=self.loras,
            offload=self.offload,
            speculative=self.speculative,
            context_shift=self.context_shift,
            n_keep=self.n_keep,
            kv_store=list(self.kv_store) or None,
            kv_store_bytes=self.kv_store_bytes,
        )
        # Ready means ready to answer at speed: the repacked weights are
        # built before the server listens (llama-server's load does it too).
        engine.engine.model.prepare(engine.engine.threads, wait=True)
        path = engine.engine.model_path
        return build_app(
            engine,
            model_name=self.model_name or (path.stem if path else "oxillama"),
            sessions_dir=self.sessions_dir,
            api_keys=self.keys() if keys is None else keys,
            metrics_auth=self.metrics_auth,
            limits=self.limits,
            tool_format=self.tool_format,
            routed_by_session_header=self.routed_by_session_header,
            reasoning_format=self.reasoning_format,
            reasoning_budget=self.reasoning_budget,
            webui=self.webui,
            reranking=self.reranking,
        )
