"""The synchronous inference session: :class:`Engine`."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.decoding.beam import Beam, BeamSearch
from oxillama.decoding.beam import check_args as check_beam_args
from oxillama.decoding.completion import Completion, FinishReason, Timings, TokenLogprob
from oxillama.decoding.grammar import Grammar, allowed_bytes
from oxillama.decoding.grammar import constraint as _constraint
from oxillama.decoding.grammar.budget import Items, sample_within_budget
from oxillama.decoding.logprobs import check_logprobs, token_logprob
from oxillama.decoding.reasoning import (
    ReasoningCap,
    ReasoningFormat,
    ReplySplit,
    opens_reasoning,
    speaks_harmony,
)
from oxillama.decoding.sampling import SamplerConfig
from oxillama.decoding.tool_calls.history import render_history
from oxillama.engine import embeddings as _emb
from oxillama.engine import rerank as _rerank
from oxillama.engine.embeddings import EmbedInput, Pooling
from oxillama.engine.kv_types import kv_types
from oxillama.engine.metrics import EngineMetrics
from oxillama.engine.perplexity import OnChunk, Perplexity
from oxillama.engine.perplexity import run as _perplexity
from oxillama.engine.rerank import RerankResult
from oxillama.engine.session_state import (
    ContextShift,
    SessionState,
    check_fits,
    kept_prefix,
    matcher_for,
)
from oxillama.errors import GenerateError, ParameterError
from oxillama.kv_store.binding import LoraKey, StoreBinding, lora_key
from oxillama.kv_store.spec import KvStoreSpec, open_store
from oxillama.kv_store.store import KvStore, import_blocks
from oxillama.model.lora import LoraAdapter, LoraSpec
from oxillama.model.lora import apply as apply_loras
from oxillama.model.lora import resolve as _resolve_loras
from oxillama.model.model import Model
from oxillama.model.offload import OffloadPolicy
from oxillama.model.rank_head import RankHead
from oxillama.text.assembler import TextAssembler

__all__ = ["Engine"]

_log = logging.getLogger("oxillama.engine")


class SnapshotCodec(Protocol):
    """Reads and writes a :class:`SessionState` as OXISNAP1. The snapshot
    package registers its codec here when it is imported (``import
    oxillama`` does that), so the engine runs snapshots without importing
    the package that knows it."""

    def dump(self, state: SessionState, path: str | os.PathLike[str], *, durable: bool) -> None: ...
    def dumps(self, state: SessionState) -> bytes: ...
    def size(self, state: SessionState) -> int: ...
    def into(self, state: SessionState, buffer: Any) -> int: ...
    def read(
        self, source: str | os.PathLike[str] | bytes | bytearray | memoryview, **kw: Any
    ) -> SessionState: ...


_CODEC: list[SnapshotCodec] = []
#: The package whose import registers the OXISNAP1 codec.
CODEC_PACKAGE = "oxillama.sessions"


def register_snapshot_codec(codec: SnapshotCodec) -> None:
    _CODEC[:] = [codec]


def _codec() -> SnapshotCodec:
    if not _CODEC:
        # The codec's package registers it on import; a process that reaches
        # an engine without it (an unpickled Engine, say) loads it by name.
        importlib.import_module(CODEC_PACKAGE)
    return _CODEC[0]


Prompt = str | Sequence[int]
OnToken = Callable[[int, str], "bool | None"]
Message = Mapping[str, Any]


class Engine:
    """One model and one live inference session on it.

    A session continues: ``generate`` appends the prompt after what is
    already in the context and the generated tokens stay there, so a chat
    can go on turn after turn. ``reset()`` starts over. The session owns a
    live sampler (RNG, mirostat state, penalty history) that carries over
    from call to call unless a new ``sampler`` is passed.

    An ``Engine`` is one session and is not meant to be driven from two
    threads at once. Its weights are a :class:`~oxillama.Model` shared by
    every engine of the process on the same file (``Engine(path)`` finds it
    in a process-wide cache), so an engine costs its KV cache, sampler and
    token history: memory that grows with the tokens it holds.

    A full context ends a generation with ``finish_reason="length"``.
    ``context_shift=True`` (off by default, as in llama.cpp) shifts it
    instead, as llama.cpp's ``--context-shift --keep N`` does: the first
    ``n_keep`` tokens stay (and a leading BOS the model adds), half of the
    rest are dropped, the cached keys after them are rotated to their new
    positions, and generation goes on. A prompt that does not fit what is
    left shifts the context first. Recurrent architectures refuse it
    (:class:`~oxillama.ParameterError`).

    ``kv_store`` (a folder, a ``redis://HOST:PORT/DB`` URL, or a list of
    them, tiers in order) keeps the KV of finished generations in
    content-addressed blocks of 256 positions: a later prompt, in this
    process or another, that begins with stored blocks restores them and
    prefills only the rest, with the same output. ``kv_store_bytes``
    bounds the folder (least recently used blocks go first). See
    docs/prefix-store.md.
    """

    _store: StoreBinding | None
    _store_loras: LoraKey | None

    def __init__(
        self,
        model: Model | str | os.PathLike[str] | None = None,
        *,
        context_size: int | None = None,
        threads: int | None = None,
        sampler: SamplerConfig | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        kv_dtype: str = "f16",
        prefill_chunk: int = 512,
        lora: LoraSpec | None = None,
        offload: OffloadPolicy | None = None,
        context_shift: bool = False,
        n_keep: int = 0,
        kv_dtype_k: str | None = None,
        kv_dtype_v: str | None = None,
        kv_store: KvStoreSpec | None = None,
        kv_store_bytes: int | None = None,
        kv_positions: int | None = None,
    ) -> None:
        if isinstance(model, Model):
            if tokenizer_path is not None:
                raise ParameterError(
                    "tokenizer_path applies when opening a file; pass it to Model(...) instead"
                )
            m = model
        else:
            # The process-wide cache: a file this process already holds is
            # not loaded again.
            m = Model(model, tokenizer_path=tokenizer_path)
        kv = kv_types(kv_dtype, kv_dtype_k, kv_dtype_v)
        self._init(m, context_size, threads, sampler, kv, prefill_chunk, offload, kv_positions)
        self._state.context_shift = ContextShift.of(context_shift, n_keep, m)
        store = open_store(kv_store, kv_store_bytes)
        if store is not None:
            self._store = StoreBinding(store, m, kv, self._session.kv_rot)
        if lora is not None:
            self.set_loras(lora)

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str,
        *,
        revision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        **engine_kwargs: Any,
    ) -> Engine:
        """An engine on the GGUF ``filename`` (a name, or a glob matching
        exactly one file) of the Hugging Face Hub repo ``repo_id``; see
        :meth:`Model.from_pretrained`. ``engine_kwargs`` go to ``Engine``.
        Its snapshots record the repo, commit and file, so ``restore`` on a
        machine without the original path finds the model in the hub cache."""
        model = Model.from_pretrained(
            repo_id, filename, revision=revision, cache_dir=cache_dir, tokenizer_path=tokenizer_path
        )
        return cls(model, **engine_kwargs)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        tokenizer_json: str | None = None,
        context_size: int | None = None,
        threads: int | None = None,
        sampler: SamplerConfig | None = None,
        kv_dtype: str = "f16",
        prefill_chunk: int = 512,
        offload: OffloadPolicy | None = None,
        context_shift: bool = False,
        n_keep: int = 0,
        kv_dtype_k: str | None = None,
        kv_dtype_v: str | None = None,
    ) -> Engine:
        """An engine on a GGUF image held in memory (``tokenizer_json`` is
        the text of a tokenizer.json that overrides the GGUF vocabulary)."""
        model = Model.from_bytes(data, tokenizer_json=tokenizer_json)
        self = cls.__new__(cls)
        kv = kv_types(kv_dtype, kv_dtype_k, kv_dtype_v)
        self._init(model, context_size, threads, sampler, kv, prefill_chunk, offload)
        self._state.context_shift = ContextShift.of(context_shift, n_keep, model)
        return self

    def _init(
        self,
        model: Model,
        context_size: int | None,
        threads: int | None,
        sampler: SamplerConfig | None,
        kv_dtype: str,
        prefill_chunk: int,
        offload: OffloadPolicy | None = None,
        kv_positions: int | None = None,
    ) -> None:
        if context_size is not None and (not isinstance(context_size, int) or context_size < 1):
            raise ParameterError(f"context_size must be a positive integer, got {context_size!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ParameterError(f"threads must be a positive integer, got {threads!r}")
        n_ctx = context_size if context_size is not None else model.n_ctx_train
        if kv_positions is None:
            session = _native.Session(model.native, n_ctx, threads, kv_dtype)
        else:
            if (
                isinstance(kv_positions, bool)
                or not isinstance(kv_positions, int)
                or kv_positions < n_ctx
            ):
                raise ParameterError(
                    f"kv_positions must be an integer of at least the context size ({n_ctx}), "
                    f"got {kv_positions!r}"
                )
            # A pool for the engine and its forks: address space, committed
            # only where a position is written.
            probe = _native.KvPool(model.native, 1, kv_dtype)
            pool = _native.KvPool(model.native, -(-kv_positions // probe.page_size), kv_dtype)
            session = _native.Session(model.native, n_ctx, threads, kv_dtype, pool=pool)
        session.prefill_chunk = prefill_chunk
        model.apply_offload(offload)
        model.prepare(session.threads)
        self._bind(model)
        config = sampler if sampler is not None else SamplerConfig()
        self._state = SessionState.fresh(model, session, config)

    def _bind(self, model: Model) -> None:
        self.model = model
        self.model_path = model.model_path
        self.tokenizer_path = model.tokenizer_path
        self.metadata: dict[str, Any] = model.metadata
        self.tokenizer = model.tokenizer
        self._model = model.native
        self._chat_template = model.chat_template
        self._metrics = EngineMetrics()
        #: The last beam search (its ``peak_pages``, for tests and tuning).
        self._last_beam: BeamSearch | None = None
        self._lora_cache: dict[Path, LoraAdapter] = {}
        #: The prefix store (None: none), and the adapters every position
        #: of the context was computed under (None: unknown or mixed, so
        #: the context is neither looked up nor stored until it is empty).
        self._store = None
        self._store_loras = None

    # ---------------------------------------------------------------- state
    #
    # Everything a session is lives in one SessionState (``_state``): the
    # native session (KV and position), tokens, live sampler, grammar, and
    # the next-token logits, possibly still as the hidden state the head
    # turns into the same logits bit for bit. The names below are views of
    # it, used by this class and by the speculative engine.

    @property
    def _session(self) -> _native.Session:
        return self._state.kv

    @property
    def _tokens(self) -> list[int]:
        return self._state.tokens

    @_tokens.setter
    def _tokens(self, tokens: list[int]) -> None:
        self._state.tokens = tokens

    @property
    def _sampler(self) -> _native.Sampler:
        return self._state.sampler

    @property
    def _sampler_config(self) -> SamplerConfig:
        return self._state.sampler_config

    @property
    def _grammar(self) -> tuple[Grammar, _native.GrammarMatcher] | None:
        """The grammar of the last constrained call and its live matcher."""
        return self._state.grammar

    @_grammar.setter
    def _grammar(self, live: tuple[Grammar, _native.GrammarMatcher] | None) -> None:
        self._state.grammar = live

    @property
    def _last_logits(self) -> npt.NDArray[np.float32] | None:
        return self._state.last_logits()

    @_last_logits.setter
    def _last_logits(self, logits: npt.NDArray[np.float32] | None) -> None:
        self._state.set_logits(logits)

    def export_state(self) -> SessionState:
        """Moves the session out (KV, tokens, sampler, grammar, logits) and
        leaves this engine empty, on a fresh context of the same size."""
        state, kv = self._state, self._state.kv
        fresh = _native.Session(self._model, kv.n_ctx, kv.threads, kv.kv_dtype)
        fresh.prefill_chunk = kv.prefill_chunk
        self._state = SessionState.fresh(self.model, fresh, state.sampler_config)
        self._state.set_loras(state.loras)
        self._state.context_shift = state.context_shift
        return state

    @classmethod
    def from_state(cls, state: SessionState) -> Engine:
        """An engine that continues ``state`` (which it takes over)."""
        self = cls.__new__(cls)
        self._bind(state.model)
        self._state = state
        return self

    def _view_state(self) -> SessionState:
        """The live state, shared (not moved): for writing a snapshot."""
        return self._state

    # ------------------------------------------------------------------ LoRA

    def load_lora(
        self, path: str | os.PathLike[str], *, scale: float = 1.0, name: str | None = None
    ) -> LoraAdapter:
        """Loads a GGUF LoRA adapter for this engine's model and activates
        it with ``scale`` beside the adapters already active (stacked:
        their deltas add). The base weights are not touched."""
        adapter = LoraAdapter(self.model, path, name=name)
        self._lora_cache[adapter.path] = adapter
        active = dict(self._state.loras)
        active[adapter] = scale
        self.set_loras(active)
        return adapter

    def _load_lora_path(self, path: str | os.PathLike[str]) -> LoraAdapter:
        key = Path(path).resolve()
        if key not in self._lora_cache:
            self._lora_cache[key] = LoraAdapter(self.model, key)
        return self._lora_cache[key]

    def set_loras(self, loras: LoraSpec) -> None:
        """Replaces the active adapters: ``{adapter or path: scale}``, a list
        of adapters, paths or ``(adapter or path, scale)`` pairs, or one of
        them. The KV cache keeps what it holds: clear it (``reset``) to
        recompute a context under the new adapters."""
        self._state.set_loras(_resolve_loras(self.model, loras, self._load_lora_path))

    def clear_loras(self) -> None:
        """Turns every adapter off (the base model alone)."""
        self._state.set_loras({})

    @property
    def loras(self) -> dict[LoraAdapter, float]:
        """The active adapters and their scales, in order (a copy)."""
        return dict(self._state.loras)

    # ------------------------------------------------------------------ info

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def n_ctx(self) -> int:
        return int(self._session.n_ctx)

    @property
    def context_shift(self) -> ContextShift | None:
        """The session's context shift (``Engine(context_shift=True,
        n_keep=N)``), or None: a full context then ends a generation with
        ``finish_reason="length"``. A snapshot carries it."""
        return self._state.context_shift

    @property
    def context_shifts(self) -> int:
        """How many context shifts the session has made."""
        return self._state.shifts

    @property
    def offload(self) -> OffloadPolicy | None:
        """The memory policy of this engine's model (shared by every
        engine on it; see :meth:`Model.set_offload`)."""
        return self.model.offload

    @property
    def n_past(self) -> int:
        """Number of tokens in the context."""
        return int(self._session.n_past)

    @property
    def tokens(self) -> list[int]:
        """The session's token history (a copy)."""
        return list(self._tokens)

    @property
    def threads(self) -> int:
        return int(self._session.threads)

    @threads.setter
    def threads(self, n: int) -> None:
        self._session.threads = n

    @property
    def threads_in_use(self) -> int:
        """The threads the last forward pass ran on: `threads`, or this
        process's share of the cores while other oxillama processes of the
        same user decode on the same CPUs (see "Threads" in the docs;
        ``OXILLAMA_SHARE_CORES=0`` turns the sharing off)."""
        return int(self._session.threads_in_use)

    @property
    def arch(self) -> str:
        return str(self._model.arch)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._model.config())

    @property
    def sampler(self) -> SamplerConfig:
        return self._sampler_config

    # ------------------------------------------------------------ embeddings

    @property
    def pooling(self) -> Pooling:
        """The pooling ``embed`` uses by default: the file's
        ``<arch>.pooling_type``, else ``"last"`` (a reranker has none:
        :class:`ParameterError`)."""
        reranker = self.model.rank_head is not None
        return _emb.default_pooling(self.metadata, self.arch, reranker=reranker)

    def embed(
        self,
        texts: EmbedInput,
        *,
        pooling: Pooling | None = None,
        normalize: bool = True,
        truncate: bool = True,
    ) -> npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]:
        """Embeddings of ``texts``: a string or a token-id list gives a
        ``(dim,)`` vector, a list of them an ``(n, dim)`` float32 array
        (``pooling="none"``: one ``(tokens, dim)`` array per input, in a
        list or alone). Texts get the model's special tokens; token ids are
        used as given. All inputs go through batched forward passes of
        their own, so the generation session is left exactly as it was.
        An input longer than the context is cut when ``truncate``, else a
        :class:`GenerateError` names it; ``normalize`` scales each vector
        to unit length. The engine's active LoRA adapters apply."""
        mode = self.pooling if pooling is None else _emb.check_pooling(pooling)
        n = _emb.max_len(self._model, self.n_ctx)
        prepared = _emb.prepare(texts, self.tokenizer, n, truncate=truncate)
        # The session's active LoRA adapters apply, as to its generation.
        loras = [(a.native, float(s)) for a, s in self._state.loras.items() if s != 0.0]
        return _emb.embed(self._model, prepared, mode, normalize, self.threads, n, loras)

    def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int | None = None
    ) -> list[RerankResult]:
        """Scores each of ``documents`` against ``query`` with a reranker
        (a cross-encoder: a BERT GGUF with a classifier head) and returns them
        best first, the first ``top_n`` (all by default): each result's
        ``index`` in ``documents`` and ``relevance_score``, the classifier's
        raw logit, as llama-server's ``/v1/rerank`` gives it. The pairs run
        in forward passes of their own; the generation session is left as
        it was. A :class:`ParameterError` if the model is not a reranker; a
        :class:`GenerateError` names a pair longer than the model takes."""
        query, docs, n = _rerank.check_request(query, documents, top_n)
        head = self._require_rank_head()
        limit = _emb.max_len(self._model, self.n_ctx)
        seqs = _rerank.prepare(head, self.tokenizer, query, docs, limit)
        loras = [(a.native, float(s)) for a, s in self._state.loras.items() if s != 0.0]
        hidden = self._model.embed_hidden(seqs, self.threads, limit, _emb.PASS_ROWS, loras)
        return _rerank.rank(head, hidden, seqs, n)

    def _require_rank_head(self) -> RankHead:
        head = self.model.rank_head
        if head is None:
            raise ParameterError(
                "this model is not a reranker: reranking needs a cross-encoder, a BERT "
                "with a classifier head (tensors cls.weight or cls.output.weight)"
            )
        return head

    def metrics(self) -> dict[str, float | int]:
        """Running totals of this engine's generation calls, under
        :meth:`AsyncEngine.metrics`'s names: ``prompt_tokens``,
        ``generated_tokens``, ``prefill_seconds``, ``decode_seconds``,
        ``prompt_tokens_per_second``, ``decode_tokens_per_second``, plus
        ``calls``, ``prefix_cache_enabled`` (0: an engine keeps its own
        context, it has no shared prefix cache) and
        ``reused_prompt_tokens`` (chat prompt tokens the context already
        held). A restored or copied engine starts from zero. Under an
        offload policy, also the pager's counters for the whole model
        (``offload_budget``, ``offload_resident_bytes``,
        ``offload_peak_resident_bytes``, ``offload_pinned_bytes``,
        ``offload_layer_loads``, ``offload_evictions``,
        ``offload_bytes_read``, ``offload_passes``). With a prefix store,
        ``kv_store_<count>_<tier>`` for the counts ``hits``, ``misses``,
        ``corrupt_blocks``, ``tokens_saved``, ``bytes_saved``, ``writes`` and
        ``errors`` of each tier (``disk``, ``redis``)."""
        store = {} if self._store is None else self._store.store.metrics()
        return {**self._metrics.as_dict(), **self.model.offload_metrics(), **store}

    # ------------------------------------------------------------- tokenizer

    def tokenize(
        self, text: str, *, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens))

    def token_to_piece(self, token: int) -> bytes:
        return self.tokenizer.token_to_piece(token)

    def is_eos(self, token: int) -> bool:
        """True for every end-of-generation token (EOS, EOT, ``<|im_end|>``...)."""
        return self.tokenizer.is_eog(token)

    # ------------------------------------------------------------ evaluation

    def eval(self, tokens: Sequence[int], *, all_logits: bool = False) -> npt.NDArray[np.float32]:
        """Appends ``tokens`` to the session and returns float32 logits of the
        last position ``(vocab,)``, or of every given position
        ``(len(tokens), vocab)`` with ``all_logits=True``."""
        toks = self._check_tokens(tokens)
        if not toks:
            raise GenerateError("eval needs at least one token")
        self._note_kv_loras()
        logits = self._session.eval(np.asarray(toks, dtype=np.uint32), all_logits)
        self._tokens.extend(toks)
        self._last_logits = logits[-1] if all_logits else logits
        for t in toks:
            self._sampler.accept(t)
        return logits

    def forward_one(self, token: int) -> npt.NDArray[np.float32]:
        """Evaluates a single token; returns its logits."""
        return self.eval([token])

    def truncate(self, n: int) -> None:
        """Keeps the first ``n`` tokens of the context and forgets the rest."""
        if not 0 <= n <= self.n_past:
            raise ParameterError(f"truncate: n must be between 0 and {self.n_past}, got {n}")
        self._state.truncate(n)

    def reset(self) -> None:
        """Empties the context; the sampler starts over from its seed (the
        drawn one, for an unseeded config)."""
        self._session.reset()
        self._tokens.clear()
        self._state.shifts = 0
        self._last_logits = None
        self._sampler.reset()
        self._grammar = None

    def set_sampler(self, config: SamplerConfig) -> None:
        """Replaces the live sampler with a fresh one built from ``config``."""
        self._state.set_sampler(config)

    def _check_tokens(self, tokens: Sequence[int]) -> list[int]:
        toks = [int(t) for t in tokens]
        bad = [t for t in toks if not 0 <= t < self.vocab_size]
        if bad:
            raise GenerateError(f"token id {bad[0]} is outside the vocabulary of {self.vocab_size}")
        return toks

    def perplexity(
        self,
        text: str | None = None,
        *,
        n_ctx: int | None = None,
        chunks: int | None = None,
        save_logits: str | os.PathLike[str] | None = None,
        kl_base: str | os.PathLike[str] | None = None,
        on_chunk: OnChunk | None = None,
    ) -> Perplexity:
        """The model's perplexity over ``text``, computed as llama.cpp's
        ``llama-perplexity`` computes it: the text is tokenized whole (BOS
        as the model adds it) and cut into ``chunks`` (default: all)
        non-overlapping chunks of ``n_ctx`` tokens (default 512); each is
        evaluated from an empty context, its first token replaced by BOS
        when the model adds one, and its second half is scored. The text
        must tokenize to at least ``2 * n_ctx`` tokens.

        ``save_logits`` writes the log-probabilities in llama.cpp's
        ``--kl-divergence-base`` format; ``kl_base`` (no ``text``: the
        tokens come from the file) compares this model with such a file and
        fills :attr:`Perplexity.kl`. ``on_chunk`` receives a
        :class:`~oxillama.engine.perplexity.PerplexityProgress` before the
        first chunk and after each. The engine's own context runs the chunks (its context size
        must hold ``n_ctx``) and is left empty."""
        return _perplexity(
            self,
            text,
            n_ctx=n_ctx,
            chunks=chunks,
            save_logits=save_logits,
            kl_base=kl_base,
            on_chunk=on_chunk,
        )

    # ------------------------------------------------------------ generation

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                return []
            return self.tokenize(prompt, add_special=self.n_past == 0, parse_special=True)
        return self._check_tokens(prompt)

    def _run(
        self,
        prompt: Prompt,
        max_tokens: int,
        sampler: SamplerConfig | None,
        stop: Sequence[str],
        ignore_eos: bool,
        on_token: OnToken | None,
        result: list[Completion],
        constraint: Grammar | None = None,
        logprobs: int | None = None,
        grammar_budget: bool = True,
        cap: ReasoningCap | None = None,
    ) -> Iterator[str]:
        logprobs = check_logprobs(logprobs)
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ParameterError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        if isinstance(stop, str):
            stop = [stop]
        if sampler is not None:
            self.set_sampler(sampler)
        prompt_tokens = self._prompt_tokens(prompt)
        if prompt_tokens:
            self._state.shift_for(len(prompt_tokens))
        check_fits(len(prompt_tokens), self.n_past, self.n_ctx)
        # Where a later lookup of this same prompt stops (see ``_to_store``).
        mark = self.n_past + len(prompt_tokens) - 1
        t0 = time.perf_counter()
        if prompt_tokens:
            self.eval(self._from_store(prompt_tokens))
        elif self._last_logits is None:
            if not self._tokens:
                raise GenerateError("empty prompt and empty context: nothing to continue from")
            # After a truncate the last position must be recomputed.
            last = self._tokens[-1]
            self._state.rewind_kv(self.n_past - 1)
            self._tokens.pop()
            self._last_logits = self._session.eval(np.asarray([last], dtype=np.uint32), False)
            self._tokens.append(last)
        t1 = time.perf_counter()

        out = TextAssembler(stop)
        generated: list[int] = []
        lps: list[TokenLogprob] = []
        forced = False  # the token budget chose some tokens to close the grammar
        finish: FinishReason = "length"
        matcher = self._matcher_for(constraint, resume=not prompt_tokens)
        items = Items.of(constraint)
        forcing: list[int] = []  # the close a reasoning cap forces next
        while len(generated) < max_tokens:
            if not self._state.shift_for(1):
                finish = "length"
                break
            assert self._last_logits is not None
            if matcher is not None and matcher.is_terminated():
                finish = "stop"  # the grammar is complete: nothing may follow
                break
            if forcing and matcher is None:
                tok = forcing.pop(0)
            elif matcher is None:
                tok = int(self._sampler.sample(self._last_logits, None))
            elif grammar_budget:
                tok, by_budget = sample_within_budget(
                    self._sampler,
                    matcher,
                    self._last_logits,
                    allowed_bytes(matcher, self.vocab_size),
                    self.vocab_size,
                    self._room(max_tokens - len(generated)),
                    items,
                )
                forced = forced or by_budget
            else:
                tok = int(
                    self._sampler.sample(self._last_logits, allowed_bytes(matcher, self.vocab_size))
                )
                if not matcher.accept_token(tok):
                    raise GenerateError(f"internal error: sampled token {tok} the grammar refuses")
            if self.tokenizer.is_eog(tok) and (not ignore_eos or matcher is not None):
                # With a grammar, EOS is only sampled where the grammar may
                # end, and then it ends the text even under ignore_eos.
                self._sampler.accept(tok)
                finish = "eos"
                break
            generated.append(tok)
            if logprobs is not None:
                lps.append(token_logprob(self._last_logits, tok, logprobs, self.tokenizer))
            self.eval([tok])
            piece = out.push(self.tokenizer.token_to_piece(tok))
            if cap is not None and not forcing:
                forcing = list(cap.due(len(generated), out.text))
            if piece:
                yield piece
            if on_token is not None and on_token(tok, piece) is False:
                finish = "stop"
                break
            if out.stopped:
                finish = "stop"
                break
        tail = out.finish()
        if tail:
            yield tail
        if (
            finish == "length"
            and matcher is not None
            and (matcher.is_terminated() or (items is not None and matcher.is_accepting()))
        ):
            # The tokens ran out exactly where the grammar was complete (or,
            # for a run of items, where one ended): nothing was cut.
            finish = "stop"
        if forced:
            finish = "length"  # complete, but only because the budget closed it
        t2 = time.perf_counter()
        self._metrics.record(len(prompt_tokens), t1 - t0, len(generated), t2 - t1)
        self._to_store(mark)
        result.append(
            Completion(
                text=out.text,
                tokens=generated,
                finish_reason=finish,
                timings=Timings(len(prompt_tokens), t1 - t0, len(generated), t2 - t1),
                seed=self._sampler_config.seed,
                logprobs=None if logprobs is None else tuple(lps),
            )
        )

    # --------------------------------------------------------- prefix store

    @property
    def kv_store(self) -> KvStore | None:
        """The prefix store (``kv_store=``), or None."""
        return None if self._store is None else self._store.store

    def _note_kv_loras(self) -> None:
        """Records the adapters the context is computed under before new
        positions are evaluated (see ``_store_loras``)."""
        if self._store is None:
            return
        key = lora_key(self._state.loras)
        if self.n_past == 0:
            self._store_loras = key
        elif self._store_loras != key:
            self._store_loras = None

    def _store_usable(self) -> LoraKey | None:
        """The adapters' key when the context may be looked up and stored:
        computed under one stack of adapters and never shifted."""
        if self._store is None or self._state.shifts:
            return None
        key = lora_key(self._state.loras)
        return key if self._store_loras == key else None

    def _from_store(self, prompt_tokens: list[int]) -> list[int]:
        """Restores the stored blocks that extend the context along
        ``prompt_tokens``; returns the tokens left to evaluate."""
        self._note_kv_loras()
        key = self._store_usable()
        if key is None:
            return prompt_tokens
        assert self._store is not None
        held = self._tokens
        full = held + prompt_tokens
        try:
            got = self._store.fetch(full, self.n_past, key)
            if got is None:
                return prompt_tokens
            n = got[0]
            # On error the session is unchanged, and the prompt prefilled.
            import_blocks(self._session, got, self.n_past)
        except Exception:
            _log.exception("kv_store: restoring stored blocks failed; prefilling instead")
            return prompt_tokens
        for t in full[len(held) : n]:
            self._sampler.accept(t)
        self._tokens = full[:n]
        self._last_logits = None
        return full[n:]

    def _to_store(self, mark: int) -> None:
        """Queues the context's new blocks for the store (written on its
        thread; :meth:`KvStore.flush` waits for them), with a partial block
        up to ``mark`` (the prompt's end less the token a lookup leaves)."""
        key = self._store_usable()
        if key is not None:
            assert self._store is not None
            try:
                self._store.save(self._tokens, self._session, (mark,), key)
            except Exception:  # the generation is done; storing it is a bonus
                _log.exception("kv_store: storing the context's blocks failed")

    def _room(self, budget: int) -> int:
        """Tokens a generation may still add: its budget, and without a
        context shift what is left of the context."""
        if self._state.context_shift is not None:
            return budget
        return min(budget, self.n_ctx - self.n_past)

    def generate(
        self,
        prompt: Prompt = "",
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        on_token: OnToken | None = None,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        lora: LoraSpec | None = None,
        logprobs: int | None = None,
        grammar_budget: bool = True,
    ) -> Completion:
        """Generates up to ``max_tokens`` tokens after ``prompt``.

        ``prompt`` is text or token ids; an empty prompt continues from the
        current position. ``on_token(id, text)`` is called per token; return
        ``False`` from it to stop early.

        ``grammar`` (GBNF text or a :class:`~oxillama.Grammar`) or
        ``json_schema`` (a dict or a pydantic model) constrains the output,
        at any temperature; EOS is allowed only where the grammar may end,
        and generation stops when it is complete. An empty prompt with the
        same grammar continues a constrained text where it stopped (also
        after a snapshot restore).

        ``lora`` (as :meth:`set_loras` takes it) replaces the active
        adapters for this call only; the tokens it evaluates stay in the
        context, computed with them.

        ``logprobs=k`` (0 to 20) puts each generated token's log-probability
        and the ``k`` most likely alternatives on ``Completion.logprobs``
        (see :class:`~oxillama.TokenLogprob`).

        Under a grammar, ``grammar_budget`` (on by default) keeps the text
        completable within ``max_tokens``: when the tokens left would no
        longer fit the grammar's shortest completion, the next tokens are
        drawn from those that close it along a shortest path. The text is
        then complete and valid, and ``finish_reason`` is ``"length"``.
        """
        constraint = _constraint(grammar, json_schema)
        result: list[Completion] = []
        with self._call_loras(lora):
            for _ in self._run(
                prompt,
                max_tokens,
                sampler,
                stop,
                ignore_eos,
                on_token,
                result,
                constraint,
                logprobs,
                grammar_budget,
            ):
                pass
        return result[0]

    @contextlib.contextmanager
    def _call_loras(self, lora: LoraSpec | None) -> Iterator[None]:
        if lora is None:
            yield
            return
        before = dict(self._state.loras)
        self.set_loras(lora)
        try:
            yield
        finally:
            self._state.set_loras(before)

    def stream(
        self,
        prompt: Prompt = "",
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        on_token: OnToken | None = None,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        lora: LoraSpec | None = None,
    ) -> Iterator[str]:
        """Like :meth:`generate`, yielding text pieces as they are produced.
        A piece never splits a UTF-8 character or reveals a stop string."""
        constraint = _constraint(grammar, json_schema)
        result: list[Completion] = []
        with self._call_loras(lora):
            yield from self._run(
                prompt, max_tokens, sampler, stop, ignore_eos, on_token, result, constraint
            )

    # ------------------------------------------------------------ beam search

    def beam_search(
        self,
        prompt: Prompt,
        *,
        beam_width: int = 4,
        max_tokens: int = 256,
        length_penalty: float = 1.0,
        early_stopping: bool = True,
    ) -> list[Beam]:
        """The ``beam_width`` most likely continuations of ``prompt`` (text,
        with the model's special tokens, or token ids), best first by
        ``logprob_sum / len(tokens) ** length_penalty``.

        The prompt is evaluated once; beams fork its KV (pages shared until
        written) and advance together, one batched forward pass per step.
        ``early_stopping`` ends the search once ``beam_width`` hypotheses
        have ended; otherwise it goes on while a live beam could still beat
        them. The engine's own context is not touched; its active LoRA
        adapters apply. Raises ``KvCacheFullError`` only if the search's own
        page pool runs out (it is sized for every beam at full length).
        Beams end at the context size; an engine with ``context_shift=True``
        refuses (:class:`~oxillama.ParameterError`) a search that would
        reach it, since beams do not shift."""
        search, pool = self._beam_start(
            prompt, beam_width, max_tokens, length_penalty, early_stopping
        )
        while not search.step(pool):
            pass
        return search.results(self.detokenize)

    def _beam_start(
        self,
        prompt: Prompt,
        beam_width: int,
        max_tokens: int,
        length_penalty: float,
        early_stopping: bool,
    ) -> tuple[BeamSearch, _native.KvPool]:
        """A search with its prompt evaluated, on a page pool of its own."""
        check_beam_args(beam_width, max_tokens, length_penalty)
        toks = (
            self.tokenize(prompt, add_special=True, parse_special=True)
            if isinstance(prompt, str)
            else self._check_tokens(prompt)
        )
        if not toks:
            raise GenerateError("beam search needs a prompt of at least one token")
        check_fits(len(toks), 0, self.n_ctx)
        if self._state.context_shift is not None and len(toks) + max_tokens > self.n_ctx:
            # Every beam would have to shift its own forked KV; rather than
            # cut the search at the context size, say so.
            raise ParameterError(
                "context shift is not supported with beam search: a prompt of "
                f"{len(toks)} tokens and max_tokens={max_tokens} exceed the context size "
                f"of {self.n_ctx} (this engine has context_shift=True; use max_tokens <= "
                f"{self.n_ctx - len(toks)})"
            )
        max_tokens = min(max_tokens, self.n_ctx - len(toks))
        kv = self._session
        probe = _native.KvPool(self._model, 1, kv.kv_dtype)
        per_seq = -(-(len(toks) + max_tokens) // probe.page_size) + 1
        pool = _native.KvPool(self._model, per_seq * (beam_width + 1), kv.kv_dtype)
        root = _native.Session(self._model, self.n_ctx, kv.threads, kv.kv_dtype, pool=pool)
        root.prefill_chunk = kv.prefill_chunk
        apply_loras(root, self._state.loras)
        logits = root.eval(np.asarray(toks, dtype=np.uint32), False)
        search = BeamSearch(
            root,
            logits,
            is_eog=self.tokenizer.is_eog,
            beam_width=beam_width,
            max_tokens=max_tokens,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        self._last_beam = search
        return search, pool

    # ------------------------------------------------------------------ chat

    @property
    def chat_template_source(self) -> str | None:
        """The Jinja source of the chat template in use."""
        return self._chat_template.source

    def apply_chat_template(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Renders ``messages`` with the model's chat template. Tool calls
        and results in the history render with or without ``tools``: as
        the template reads them if it knows tools, else as the text the
        model wrote; a ``null`` content beside tool calls (what the OpenAI
        API returns) becomes ``""`` where the template cannot take it."""
        return render_history(
            self._chat_template, messages, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def _prime_chat(self, text: str) -> list[int]:
        """The tokens of the rendered chat ``text`` that the context does
        not already hold, the rest of the context dropped."""
        toks = self.tokenize(text, add_special=True, parse_special=True)
        common = kept_prefix(self._tokens, toks)
        if common < self.n_past:
            self.truncate(common)
        self._metrics.reused_prompt_tokens += common
        return toks[common:]

    def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        on_token: OnToken | None = None,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        logprobs: int | None = None,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int | None = None,
        **template_kwargs: Any,
    ) -> Completion:
        """Replies to a conversation (a list of ``{"role", "content"}`` dicts);
        ``grammar`` / ``json_schema`` constrain the reply and ``logprobs``
        reports token log-probabilities, as in :meth:`generate`. A thinking
        model's ``<think>`` reasoning comes apart in ``reasoning``
        (``reasoning_format``: ``"auto"`` for a model that has the markers,
        ``"deepseek"`` always, ``"none"`` never: it stays in ``text``).
        A model whose template speaks harmony (gpt-oss) has its reply
        split by channel unless ``reasoning_format`` is ``"none"``: the
        ``analysis`` messages in ``reasoning``, the ``final`` ones in
        ``text``, and ``commentary`` messages to ``functions.NAME`` in
        ``tool_calls``. ``reasoning_budget`` caps the tokens of a
        ``<think>`` reasoning (see
        :class:`~oxillama.decoding.reasoning.ReasoningCap`)."""
        constraint = _constraint(grammar, json_schema)
        text = self.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
        split = self._reply_split(text, reasoning_format)
        cap = self._reasoning_cap(text, reasoning_budget)
        rest = self._prime_chat(text)
        whole: list[Completion] = []
        for _ in self._run(
            rest,
            max_tokens,
            sampler,
            stop,
            ignore_eos,
            on_token,
            whole,
            constraint,
            logprobs,
            cap=cap,
        ):
            pass
        return split.apply(whole[0])

    def chat_stream(
        self,
        messages: Sequence[Message],
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        result: list[Completion] | None = None,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int | None = None,
        **template_kwargs: Any,
    ) -> Iterator[str]:
        """Streaming form of :meth:`chat`: the reply's text pieces as the
        model writes them (markers and channels included); ``result``, when
        given, receives the :class:`Completion` that :meth:`chat` returns,
        split the same way."""
        constraint = _constraint(grammar, json_schema)
        text = self.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
        split = self._reply_split(text, reasoning_format)
        cap = self._reasoning_cap(text, reasoning_budget)
        rest = self._prime_chat(text)
        whole: list[Completion] = []
        yield from self._run(
            rest, max_tokens, sampler, stop, ignore_eos, None, whole, constraint, cap=cap
        )
        if result is not None and whole:
            result.append(split.apply(whole[-1]))

    def _reply_split(self, prompt: str, reasoning_format: ReasoningFormat = "auto") -> ReplySplit:
        """How this model's reply to the rendered chat ``prompt`` comes
        apart under ``reasoning_format``: what :meth:`chat` and the async
        chats apply to their completions."""
        return ReplySplit.choose(reasoning_format, self.chat_template_source, self.tokenize, prompt)

    def _reasoning_cap(self, prompt: str, budget: int | None) -> ReasoningCap | None:
        """The cap of ``budget`` tokens on the ``<think>`` reasoning of a
        reply to the rendered chat ``prompt`` (None: no cap). Harmony
        reasons in a channel, not between markers: refused there."""
        if budget is None:
            return None
        if speaks_harmony(self.chat_template_source):
            raise ParameterError(
                "reasoning_budget caps <think> reasoning; this model's template speaks "
                "harmony (gpt-oss), whose analysis channel it cannot close"
            )
        return ReasoningCap.of(
            budget,
            lambda t: self.tokenize(t, add_special=False, parse_special=True),
            inside=opens_reasoning(prompt),
        )

    # -------------------------------------------------------------- grammar

    def _matcher_for(
        self, constraint: Grammar | None, *, resume: bool
    ) -> _native.GrammarMatcher | None:
        """The matcher for a constrained call: the live one when the call
        continues (empty prompt) the same grammar, else a fresh one."""
        self._grammar, matcher = matcher_for(
            self._grammar, constraint, self.tokenizer, resume=resume
        )
        return matcher

    # ------------------------------------------------------------- snapshots

    def snapshot(self, path: str | os.PathLike[str], *, durable: bool = True) -> None:
        """Freezes the session into an OXISNAP1 file, written crash-safely (a
        temp file in the same folder, fsync, rename, fsync of the folder):
        whenever this process dies, ``path`` holds the previous complete
        file or the new one, and a failed save raises
        :class:`~oxillama.sessions.SnapshotWriteError` with the previous
        file untouched. Weights are referenced, not stored.

        ``durable=False`` skips the fsyncs: still atomic for readers and
        safe if this process is killed, but a power loss soon after may lose
        the new file (llama.cpp's own state files have that guarantee)."""
        _codec().dump(self._view_state(), path, durable=durable)

    def snapshot_bytes(self) -> bytes:
        """The session as OXISNAP1 bytes."""
        return _codec().dumps(self._view_state())

    def snapshot_size(self) -> int:
        """Bytes :meth:`snapshot_into` writes for the session as it is now
        (``llama_state_get_size``)."""
        return _codec().size(self._view_state())

    def snapshot_into(self, buffer: bytearray | memoryview | Any) -> int:
        """Writes the session as OXISNAP1 into the start of a writable
        buffer of at least :meth:`snapshot_size` bytes and returns the bytes
        written (``llama_state_get_data``): with a buffer reused across
        saves, nothing is allocated."""
        return _codec().into(self._view_state(), buffer)

    def load_snapshot(
        self, source: str | os.PathLike[str] | bytes | bytearray | memoryview
    ) -> None:
        """Replaces this engine's session with the OXISNAP1 snapshot at
        ``source`` (a path or the bytes), in place, as
        ``llama_state_set_data`` does for a loaded context: the snapshot
        must be of this engine's model (fingerprint checked), and its KV
        goes into this engine's own memory when the context size and KV
        dtype match (a new context otherwise). The engine keeps its thread
        count. On any error the engine is unchanged."""
        live = self._session

        def into_self(model: Model, n_ctx: int, threads: int | None, kv_dtype: str) -> Any:
            if n_ctx == live.n_ctx and kv_dtype == live.kv_dtype:
                return live
            return _native.Session(model.native, n_ctx, live.threads, kv_dtype)

        state = _codec().read(source, model=self.model, make_kv=into_self)
        self._state = state
        self._store_loras = None

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        *,
        model_path: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        kv_dtype: str | None = None,
    ) -> Engine:
        """A new engine that continues exactly where the snapshot at ``path``
        left off. ``model_path`` points at the model if it has moved (its
        fingerprint is still checked); ``threads`` overrides the saved count.
        ``kv_dtype`` (a type, or ``"k/v"`` types) converts the snapshot's
        KV cache into those types once, row by row; by default the engine
        keeps the snapshot's types."""
        kv = None if kv_dtype is None else kv_types(kv_dtype)
        return cls.from_state(
            _codec().read(path, model_path=model_path, threads=threads, kv_dtype=kv)
        )

    @classmethod
    def restore_bytes(
        cls,
        blob: bytes | bytearray | memoryview,
        *,
        model_path: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        kv_dtype: str | None = None,
    ) -> Engine:
        """Like :meth:`restore`, from bytes (no file is written)."""
        kv = None if kv_dtype is None else kv_types(kv_dtype)
        return cls.from_state(
            _codec().read(blob, model_path=model_path, threads=threads, kv_dtype=kv)
        )

    def __reduce__(self) -> tuple[Callable[[bytes], Engine], tuple[bytes]]:
        # Pickling goes through OXISNAP1: the model travels by path.
        return (_from_snapshot, (self.snapshot_bytes(),))

    def __deepcopy__(self, memo: dict[int, Any]) -> Engine:
        """An independent engine with the same state, its KV copied (see
        :meth:`fork` for one that shares it)."""
        return Engine.restore_bytes(self.snapshot_bytes())

    def fork(self) -> Engine:
        """A new engine that continues exactly as this one would: the same
        tokens, next-token logits, sampler state (RNG included), grammar
        state, adapters and context shift. Its KV is this engine's, shared
        copy on write: the fork costs no KV memory until one of the two
        writes a page they share (the last, partly filled page at once,
        every later page as it fills). Each continues independently and
        snapshots on its own.

        The forks of an engine draw their new pages from the engine's KV
        pool, which holds ``kv_positions`` positions (by default the
        context size), as llama.cpp's sequences share one context's cells:
        give an engine that will be forked room for every branch, e.g.
        ``Engine(path, context_size=4096, kv_positions=8192)``. A branch
        that finds the pool full raises an error that says so."""
        return Engine.from_state(self._state.fork())

    def __repr__(self) -> str:
        src = str(self.model_path) if self.model_path else "<bytes>"
        return f"Engine({src!r}, arch={self.arch!r}, n_ctx={self.n_ctx}, n_past={self.n_past})"


def _from_snapshot(blob: bytes) -> Engine:
    """Unpickles an :class:`Engine` (see ``Engine.__reduce__``)."""
    return Engine.restore_bytes(blob)
