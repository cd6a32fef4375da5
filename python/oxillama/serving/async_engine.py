"""`AsyncEngine`: many concurrent generations from one event loop, sharing
one model through continuous batching (see :mod:`oxillama.serving.scheduler`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.decoding.beam import Beam, BeamSearch
from oxillama.decoding.completion import Completion
from oxillama.decoding.grammar import Grammar
from oxillama.decoding.grammar import constraint as _constraint
from oxillama.decoding.ngram_draft import NgramCache, NgramDraft
from oxillama.decoding.reasoning import ReasoningCap, ReasoningFormat, ReplySplit
from oxillama.decoding.sampling import SamplerConfig
from oxillama.engine import embeddings as _emb
from oxillama.engine import rerank as _rerank
from oxillama.engine.embeddings import EmbedInput, Pooling
from oxillama.engine.engine import Engine, Message, Prompt
from oxillama.engine.kv_types import kv_types
from oxillama.engine.rerank import RerankResult
from oxillama.engine.session_state import SessionState
from oxillama.errors import GenerateError, LoraError, ParameterError
from oxillama.kv_store.binding import LoraKey, StoreBinding, lora_key
from oxillama.kv_store.spec import KvStoreSpec, open_store
from oxillama.kv_store.store import KvStore
from oxillama.model.lora import LoraAdapter
from oxillama.model.model import Model
from oxillama.model.offload import OffloadPolicy
from oxillama.serving.async_session import AsyncSession
from oxillama.serving.mailbox import Mailbox
from oxillama.serving.scheduler import Emit, PromptShare, Request, Scheduler
from oxillama.serving.split_result import split_result

__all__ = ["AsyncEngine", "AsyncSession"]

_END = object()


@dataclass(frozen=True)
class _Ask:
    """One request's options, built by keyword once per public call so that
    every front door (generate, stream, the n-choice forms) passes the same
    record and a new option is added in one place."""

    max_tokens: int
    sampler: SamplerConfig | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    grammar: str | Grammar | None = None
    json_schema: Mapping[str, Any] | Any | None = None
    lora: str | None = None
    logprobs: int | None = None
    grammar_budget: bool = True
    grammar_trigger: str | None = None
    speculative: str | None = None
    reasoning_cap: ReasoningCap | None = None


#: Tokens one embedding job may run between two decode steps: small enough
#: that streams sharing the worker wait one short pass, not the whole batch.
EMBED_JOB_ROWS = 512


class AsyncEngine:
    """An asyncio front end: ``await generate(...)``, ``async for piece in
    stream(...)``, ``await chat(...)``.

    Every call is an independent request with its own KV cache; concurrent
    calls are decoded together, one batched forward pass per step, and a
    long prompt is prefilled in chunks between decode steps. The event loop
    never blocks: the model runs on a worker thread without the GIL.
    Cancelling the awaiting task, or leaving an ``async for`` early, cancels
    the request and frees its memory.

    ``kv_store`` and ``kv_store_bytes`` add the tiers of the prefix store
    below the in-memory prefix cache, as for :class:`~oxillama.Engine`:
    requests and session turns without adapters restore their prompt's
    stored blocks and store their own when they finish.
    """

    def __init__(
        self,
        model: Model | str | os.PathLike[str] | None = None,
        *,
        context_size: int = 2048,
        threads: int | None = None,
        max_batch: int = 8,
        prefill_chunk: int = 64,
        max_queue: int = 256,
        prefix_cache_bytes: int = 256 << 20,
        sampler: SamplerConfig | None = None,
        kv_dtype: str = "f16",
        kv_pages: int | None = None,
        loras: Mapping[str, str | os.PathLike[str] | tuple[str | os.PathLike[str], float]]
        | None = None,
        offload: OffloadPolicy | None = None,
        speculative: str | NgramDraft | None = None,
        context_shift: bool = False,
        n_keep: int = 0,
        kv_dtype_k: str | None = None,
        kv_dtype_v: str | None = None,
        kv_store: KvStoreSpec | None = None,
        kv_store_bytes: int | None = None,
    ) -> None:
        #: The default draft of requests (None: no speculation); a request's
        #: ``speculative=`` overrides it.
        self._draft = _draft_of(speculative, "speculative")
        self._ngram: NgramDraft | None = None
        kv_dtype = kv_types(kv_dtype, kv_dtype_k, kv_dtype_v)
        # The model (weights, tokenizer, template) is the process's one copy
        # of it; every request and session gets its own KV on those weights.
        self._engine = Engine(
            model,
            context_size=context_size,
            threads=threads,
            kv_dtype=kv_dtype,
            offload=offload,
            context_shift=context_shift,
            n_keep=n_keep,
        )
        self._kv_dtype = kv_dtype
        self._sampler = sampler or SamplerConfig()
        store = open_store(kv_store, kv_store_bytes)
        binding = (
            None
            if store is None
            else StoreBinding(store, self._engine.model, kv_dtype, self._engine._session.kv_rot)
        )
        self._scheduler = Scheduler(
            self._engine._model,
            self._engine.tokenizer,
            self._engine.vocab_size,
            context_size=self._engine.n_ctx,
            threads=threads,
            kv_dtype=kv_dtype,
            max_batch=max_batch,
            prefill_chunk=prefill_chunk,
            max_queue=max_queue,
            prefix_cache_bytes=prefix_cache_bytes,
            kv_pages=kv_pages,
            context_shift=self._engine.context_shift,
            kv_store=binding,
        )
        if self._draft is not None and self._engine.config.get("recurrent"):
            self._scheduler.close()
            raise ParameterError(
                f"speculative decoding needs an attention model; {self._engine.arch!r} is recurrent"
            )
        self._mailboxes: dict[asyncio.AbstractEventLoop, Mailbox] = {}
        #: Adapters requests may pick by name, each with its scale.
        self._loras: dict[str, tuple[LoraAdapter, float]] = {}
        for name, spec in (loras or {}).items():
            path, scale = spec if isinstance(spec, tuple) else (spec, 1.0)
            if not isinstance(name, str) or not name:
                raise ParameterError(
                    f"loras: adapter names must be non-empty strings, got {name!r}"
                )
            self._loras[name] = (LoraAdapter(self.model, path, name=name), float(scale))

    def _mailbox(self) -> Mailbox:
        loop = asyncio.get_running_loop()
        box = self._mailboxes.get(loop)
        if box is None:
            for old in [lp for lp in self._mailboxes if lp.is_closed()]:
                del self._mailboxes[old]
            box = self._mailboxes[loop] = Mailbox(loop)
        return box

    @property
    def engine(self) -> Engine:
        """The synchronous engine holding the model (tokenizer, templates)."""
        return self._engine

    @property
    def model(self) -> Model:
        """The model every request and session runs on."""
        return self._engine.model

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def kv_dtype(self) -> str:
        """The KV cache's type: ``"f16"``, ``"q8_0"``..., or ``"k/v"`` when
        keys and values differ."""
        return self._kv_dtype

    @property
    def loras(self) -> dict[str, LoraAdapter]:
        """The adapters requests can pick with ``lora="name"``."""
        return {name: a for name, (a, _) in self._loras.items()}

    def _lora(self, name: str | None) -> tuple[tuple[_native.LoraAdapter, float], ...]:
        if name is None:
            return ()
        if name not in self._loras:
            known = ", ".join(sorted(self._loras)) or "none"
            raise LoraError(f"unknown LoRA adapter {name!r} (registered: {known})")
        adapter, scale = self._loras[name]
        return ((adapter.native, scale),)

    def _lora_key(self, name: str | None) -> LoraKey:
        """The prefix store's key of adapter ``name`` (checked by _lora)."""
        if name is None:
            return ()
        adapter, scale = self._loras[name]
        return lora_key({adapter: scale})

    # ------------------------------------------------------------- sessions

    def session(self, *, sampler: SamplerConfig | None = None) -> AsyncSession:
        """A new, empty session: each call on it appends to its context, and
        its KV pages stay in the shared pool between calls (see
        :class:`AsyncSession`)."""
        kv = self._scheduler.pool_kv(self.model, self._engine.n_ctx, None, self._kv_dtype)
        state = SessionState.fresh(self.model, kv, sampler or self._sampler)
        # Sessions shift a full context as the engine was told to, as
        # one-shot requests do.
        state.context_shift = self._engine.context_shift
        return AsyncSession(self, self._scheduler.open_session(state))

    async def restore_session(
        self, source: str | os.PathLike[str] | bytes | bytearray | memoryview
    ) -> AsyncSession:
        """A session continuing the OXISNAP1 snapshot at ``source`` (a path
        or the bytes), exactly as :meth:`Engine.restore` would. The snapshot
        must be of this engine's model (its fingerprint is checked: a
        :class:`~oxillama.sessions.ModelMismatchError` otherwise). The
        checksum is verified off the event loop; the KV enters the pool when
        the first turn starts."""
        from oxillama import sessions as snapshot

        sched = self._scheduler

        def read() -> SessionState:
            return snapshot.read(source, model=self.model, make_kv=sched.pool_kv, defer_kv=True)

        state = await asyncio.get_running_loop().run_in_executor(None, read)
        return AsyncSession(self, sched.open_session(state))

    async def adopt(self, engine: Engine) -> AsyncSession:
        """Moves a synchronous engine's session (KV, tokens, sampler,
        grammar) into this engine's scheduler; ``engine`` is left empty.

        On the same :class:`Model` with the same KV dtype nothing is copied:
        the session keeps its pages and joins the batch as it is. Otherwise
        its KV is copied into the pool (the models must be the same file)."""
        if not isinstance(engine, Engine):
            raise TypeError(f"adopt takes an Engine, not {type(engine).__name__}")
        same = engine.model is self.model and engine._session.kv_dtype == self._kv_dtype
        if not same:
            self._check_same_file(engine)
            if engine.n_past > self._engine.n_ctx:
                raise ParameterError(
                    f"adopt: the engine holds {engine.n_past} tokens, more than this "
                    f"engine's context of {self._engine.n_ctx}"
                )
        state = engine.export_state()
        state.model = self.model
        if same:
            state.kv.threads = self._engine.threads
        else:
            old = state.kv
            state.kv = self._scheduler.pool_kv(self.model, old.n_ctx, None, self._kv_dtype)
            state.set_loras(state.loras)
            # The hidden state, if any, stays: the same weights' head turns it
            # into the same logits on any session.
            state.swapped = (int(old.n_past), old.export_kv())
        state.kv.prefill_chunk = self._scheduler.prefill_chunk
        return AsyncSession(self, self._scheduler.open_session(state))

    def _check_same_file(self, engine: Engine) -> None:
        a, b = engine.model, self.model
        if a.model_path is None or b.model_path is None:
            raise ParameterError("adopt needs both models opened from files, or the same Model")
        if not a.fingerprint().matches(b.fingerprint()):
            raise ParameterError(
                f"adopt: {a.model_path} is not this engine's model ({b.model_path})"
            )
        if engine._session.kv_dtype != self._kv_dtype:
            raise ParameterError(
                f"adopt: the engine's KV cache is {engine._session.kv_dtype}, "
                f"this engine's pool holds {self._kv_dtype}"
            )

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._engine.tokenize(text, add_special=add_special, parse_special=True)

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
    ) -> AsyncEngine:
        """An engine on a Hugging Face Hub GGUF; see :meth:`Engine.from_pretrained`."""
        model = Model.from_pretrained(
            repo_id, filename, revision=revision, cache_dir=cache_dir, tokenizer_path=tokenizer_path
        )
        return cls(model, **engine_kwargs)

    def metrics(self) -> dict[str, float | int]:
        """Prompt and generated tokens, prefill and decode seconds, tokens/s,
        queue length, running requests, requests holding KV memory; under
        an offload policy also the pager's ``offload_*`` counters (see
        :meth:`Engine.metrics`); ``kv_store_<count>_<tier>`` for the prefix
        cache (tier ``memory``) and the prefix store's tiers."""
        out = self._scheduler.metrics()
        out.update(self.model.offload_metrics())
        return out

    @property
    def kv_store(self) -> KvStore | None:
        """The prefix store (``kv_store=``), or None."""
        st = self._scheduler.store
        return None if st is None else st.store

    async def ready(self) -> None:
        """Returns once the model's repacked weights are built (they are
        built in the background from the engine's creation; a request that
        comes first waits for them in its first forward pass). The server
        waits for this before it listens, as llama-server loads before it
        reports ready."""
        e = self._engine
        await asyncio.to_thread(e.model.prepare, e.threads, wait=True)

    async def close(self) -> None:
        """Stops the worker (pending requests fail with GenerateError) and
        writes the prefix store's queued blocks."""
        await asyncio.get_running_loop().run_in_executor(None, self._scheduler.close)

    async def __aenter__(self) -> AsyncEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ snapshots

    @staticmethod
    async def restore(
        path: str | os.PathLike[str],
        *,
        model_path: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        kv_dtype: str | None = None,
    ) -> Engine:
        """:meth:`Engine.restore` off the event loop (model load, checksum
        and KV import run in a worker thread)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None,
            lambda: Engine.restore(path, model_path=model_path, threads=threads, kv_dtype=kv_dtype),
        )

    @staticmethod
    async def snapshot(
        engine: Engine, path: str | os.PathLike[str], *, durable: bool = True
    ) -> None:
        """:meth:`Engine.snapshot` off the event loop."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: engine.snapshot(path, durable=durable))

    # ---------------------------------------------------------- embeddings

    async def embed(
        self,
        texts: EmbedInput,
        *,
        pooling: Pooling | None = None,
        normalize: bool = True,
        truncate: bool = True,
        lora: str | None = None,
    ) -> npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]:
        """:meth:`Engine.embed` on the worker that runs generation (with the
        registered adapter ``lora`` applied, if named). The inputs go in
        slices of at most ``EMBED_JOB_ROWS`` tokens, each one job between
        two decode steps, so streams keep advancing while a large batch is
        embedded."""
        eng = self._engine
        mode = eng.pooling if pooling is None else _emb.check_pooling(pooling)
        n = _emb.max_len(eng._model, eng.n_ctx)
        prepared = _emb.prepare(texts, eng.tokenizer, n, truncate=truncate)
        return _emb.finish(await self._hidden(prepared.seqs, lora), prepared, mode, normalize)

    async def _hidden(self, seqs: list[list[int]], lora: str | None) -> npt.NDArray[np.float32]:
        """The encoder's hidden states of ``seqs`` (row after row), in jobs
        of at most ``EMBED_JOB_ROWS`` tokens on the worker."""
        eng = self._engine
        n = _emb.max_len(eng._model, eng.n_ctx)
        native, threads = eng._model, eng.threads
        loras = list(self._lora(lora))
        rows = EMBED_JOB_ROWS
        parts = []
        for group in _emb.groups(seqs, rows):
            job = self._scheduler.call(
                lambda g=group: native.embed_hidden(g, threads, n, rows, loras)  # type: ignore[misc]
            )
            parts.append(await asyncio.wrap_future(job))
        return np.concatenate(parts)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        lora: str | None = None,
    ) -> list[RerankResult]:
        """:meth:`Engine.rerank` on the worker that runs generation, between
        decode steps as :meth:`embed` runs."""
        seqs, n = self.rerank_pairs(query, documents, top_n)
        return await self.rerank_tokens(seqs, n, lora=lora)

    def rerank_pairs(
        self, query: str, documents: Sequence[str], top_n: int | None
    ) -> tuple[list[list[int]], int]:
        """The checked arguments of a rerank as the token ids of each pair
        and the number of results to return."""
        eng = self._engine
        query, docs, n = _rerank.check_request(query, documents, top_n)
        head = eng._require_rank_head()
        limit = _emb.max_len(eng._model, eng.n_ctx)
        return _rerank.prepare(head, eng.tokenizer, query, docs, limit), n

    async def rerank_tokens(
        self, seqs: list[list[int]], top_n: int, *, lora: str | None = None
    ) -> list[RerankResult]:
        """The best ``top_n`` of the pairs ``seqs`` (from :meth:`rerank_pairs`)."""
        head = self._engine._require_rank_head()
        return _rerank.rank(head, await self._hidden(seqs, lora), seqs, top_n)

    # ------------------------------------------------------------ requests

    def _prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        return self._engine._check_tokens(prompt)

    def _request_draft(self, speculative: str | None) -> NgramDraft | None:
        """A request's draft: the engine's by default, ``"none"`` for none,
        ``"ngram"`` for the engine's n-gram draft (or one made on first use,
        sharing one cache of earlier requests' n-grams)."""
        if speculative is None:
            return self._draft
        if speculative == "none":
            return None
        if speculative == "ngram":
            if self._draft is not None:
                return self._draft
            if self._ngram is None:
                self._ngram = NgramDraft(cache=NgramCache())
            return self._ngram
        raise ParameterError(f"speculative must be 'ngram' or 'none', got {speculative!r}")

    def _submit(
        self,
        prompt: Prompt,
        ask: _Ask,
        emit: Emit,
        *,
        sampler: SamplerConfig | None = None,
        share: PromptShare | None = None,
    ) -> Request:
        """Checks the options, then queues the request (``sampler``, when
        given, overrides ``ask.sampler``: one choice of several)."""
        max_tokens = ask.max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ParameterError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        stop = [ask.stop] if isinstance(ask.stop, str) else ask.stop
        constraint = _constraint(ask.grammar, ask.json_schema)
        lazy = None
        trigger = ask.grammar_trigger
        if trigger is not None:
            if not isinstance(trigger, str) or not trigger:
                raise ParameterError("grammar_trigger must be a non-empty string")
            if constraint is None:
                raise ParameterError("grammar_trigger needs a grammar or json_schema")
            lazy, constraint = (trigger, constraint), None
        return self._scheduler.submit(
            self._prompt(prompt),
            max_tokens,
            sampler or ask.sampler or self._sampler,
            stop=stop,
            ignore_eos=ask.ignore_eos,
            grammar=constraint,
            emit=emit,
            lora=self._lora(ask.lora),
            lora_key=self._lora_key(ask.lora),
            logprobs=ask.logprobs,
            share=share,
            grammar_budget=ask.grammar_budget,
            lazy=lazy,
            draft=self._request_draft(ask.speculative),
            cap=ask.reasoning_cap,
        )

    def stream(
        self,
        prompt: Prompt,
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        result: list[Completion] | None = None,
        lora: str | None = None,
        logprobs: int | None = None,
        grammar_budget: bool = True,
        grammar_trigger: str | None = None,
        speculative: str | None = None,
        reasoning_cap: ReasoningCap | None = None,
    ) -> AsyncGenerator[str, None]:
        """Yields text pieces as they are produced; ``result``, when given,
        receives the final :class:`Completion`. Nothing is checked or
        queued until the first piece is awaited. With ``logprobs=k`` each
        piece is a :class:`~oxillama.Piece` carrying the log-probabilities
        of the tokens it completes."""
        ask = _Ask(
            max_tokens,
            sampler=sampler,
            stop=stop,
            ignore_eos=ignore_eos,
            grammar=grammar,
            json_schema=json_schema,
            lora=lora,
            logprobs=logprobs,
            grammar_budget=grammar_budget,
            grammar_trigger=grammar_trigger,
            speculative=speculative,
            reasoning_cap=reasoning_cap,
        )
        return self._pieces(lambda emit: self._submit(prompt, ask, emit), result)

    async def _pieces(
        self, submit: Callable[[Emit], Request], result: list[Completion] | None
    ) -> AsyncGenerator[str, None]:
        """The pieces of the request ``submit`` queues with the emit it is given."""
        box = self._mailbox()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def emit(piece: str | None, done: Completion | None, err: BaseException | None) -> None:
            item: Any = piece if piece is not None else (err if err is not None else (_END, done))
            box.post(queue.put_nowait, item)

        req = submit(emit)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, str):
                    yield item
                elif isinstance(item, BaseException):
                    raise item
                else:
                    if result is not None and item[1] is not None:
                        result.append(item[1])
                    return
        finally:
            # Early exit, cancellation or error: the request stops at once.
            self._scheduler.cancel(req)

    async def generate(
        self,
        prompt: Prompt,
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        lora: str | None = None,
        logprobs: int | None = None,
        grammar_budget: bool = True,
        grammar_trigger: str | None = None,
        speculative: str | None = None,
        reasoning_cap: ReasoningCap | None = None,
    ) -> Completion:
        """The whole completion of one request; ``lora`` names one of the
        adapters registered with ``loras=`` (requests with different
        adapters still decode in the same batched steps); ``logprobs=k``
        fills ``Completion.logprobs`` as :meth:`Engine.generate` does.
        With ``grammar_trigger``, ``grammar`` / ``json_schema`` apply only
        from the first occurrence of that text in the output (a lazy
        grammar: free text, then a constrained part, as a tool call).
        ``reasoning_cap`` caps the reply's ``<think>`` reasoning (see
        :class:`~oxillama.decoding.reasoning.ReasoningCap`).

        Pieces are not delivered one by one: the event loop wakes once, when
        the completion is done (or failed)."""
        ask = _Ask(
            max_tokens,
            sampler=sampler,
            stop=stop,
            ignore_eos=ignore_eos,
            grammar=grammar,
            json_schema=json_schema,
            lora=lora,
            logprobs=logprobs,
            grammar_budget=grammar_budget,
            grammar_trigger=grammar_trigger,
            speculative=speculative,
            reasoning_cap=reasoning_cap,
        )
        return await self._complete(lambda emit: self._submit(prompt, ask, emit))

    async def _complete(self, submit: Callable[[Emit], Request]) -> Completion:
        """The completion of the request ``submit`` queues."""
        box = self._mailbox()
        fut: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()

        def settle(outcome: Completion | BaseException) -> None:
            if fut.done():
                return
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

        def emit(piece: str | None, done: Completion | None, err: BaseException | None) -> None:
            if err is not None:
                box.post(settle, err)
            elif done is not None:
                box.post(settle, done)
            elif piece is None:
                box.post(settle, GenerateError("the request ended without a completion"))

        req = submit(emit)
        try:
            return await fut
        finally:
            # Cancellation or error: the request stops at once (a no-op once
            # it has finished).
            self._scheduler.cancel(req)

    def _choice_samplers(self, sampler: SamplerConfig | None, n: int) -> list[SamplerConfig]:
        """Choice ``i`` of a seeded config samples with ``seed + i``, so the
        choices differ and the request repeats; unseeded, each draws its own."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ParameterError(f"n must be a positive integer, got {n!r}")
        base = sampler or self._sampler
        if base.seed is None:
            return [base] * n
        return [replace(base, seed=(base.seed + i) % 2**64) for i in range(n)]

    def _choice_submits(
        self, prompt: Prompt, n: int, ask: _Ask, share: PromptShare | None = None
    ) -> list[Callable[[Emit], Request]]:
        """One queuing function per choice, all sharing one prompt."""
        share = share if share is not None else PromptShare()
        tokens = self._prompt(prompt)

        def submit_for(cfg: SamplerConfig) -> Callable[[Emit], Request]:
            def submit(emit: Emit) -> Request:
                return self._submit(tokens, ask, emit, sampler=cfg, share=share)

            return submit

        return [submit_for(cfg) for cfg in self._choice_samplers(ask.sampler, n)]

    async def generate_n(
        self,
        prompt: Prompt,
        n: int,
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        lora: str | None = None,
        logprobs: int | None = None,
        grammar_trigger: str | None = None,
        speculative: str | None = None,
        grammar_budget: bool = True,
    ) -> list[Completion]:
        """``n`` completions of one prompt (OpenAI's ``n``), decoded in the
        same batched steps. The prompt is evaluated once: the other choices
        start from a fork of its KV (pages shared until written). With a
        seeded ``sampler``, choice ``i`` uses ``seed + i``."""
        share = PromptShare()
        submits = self._choice_submits(
            prompt,
            n,
            _Ask(
                max_tokens,
                sampler=sampler,
                stop=stop,
                ignore_eos=ignore_eos,
                grammar=grammar,
                json_schema=json_schema,
                lora=lora,
                logprobs=logprobs,
                grammar_budget=grammar_budget,
                grammar_trigger=grammar_trigger,
                speculative=speculative,
            ),
            share,
        )
        # The gather below queues the choices one event-loop step apart: the
        # followers are promised up front, so the leader keeps its prompt
        # for them however soon it is done.
        share.expected = len(submits) - 1
        try:
            return list(await asyncio.gather(*(self._complete(f) for f in submits)))
        finally:
            self._scheduler.release_share(share)

    def stream_n(
        self,
        prompt: Prompt,
        n: int,
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        results: list[list[Completion]] | None = None,
        lora: str | None = None,
        logprobs: int | None = None,
        grammar_trigger: str | None = None,
        speculative: str | None = None,
        grammar_budget: bool = True,
    ) -> list[AsyncGenerator[str, None]]:
        """The streaming form of :meth:`generate_n`: one piece stream per
        choice (``results[i]``, when given, receives choice ``i``'s
        :class:`Completion`). Each is queued when first awaited; the prompt
        is shared among the choices queued before the first one finishes
        its prompt."""
        if results is not None and len(results) != n:
            raise ParameterError(f"results needs {n} lists, got {len(results)}")
        submits = self._choice_submits(
            prompt,
            n,
            _Ask(
                max_tokens,
                sampler=sampler,
                stop=stop,
                ignore_eos=ignore_eos,
                grammar=grammar,
                json_schema=json_schema,
                lora=lora,
                logprobs=logprobs,
                grammar_budget=grammar_budget,
                grammar_trigger=grammar_trigger,
                speculative=speculative,
            ),
        )
        return [
            self._pieces(f, None if results is None else results[i]) for i, f in enumerate(submits)
        ]

    async def beam_search(
        self,
        prompt: Prompt,
        *,
        beam_width: int = 4,
        max_tokens: int = 256,
        length_penalty: float = 1.0,
        early_stopping: bool = True,
    ) -> list[Beam]:
        """:meth:`Engine.beam_search`, one step at a time on the worker
        between batched steps, so running streams keep going meanwhile."""
        sched = self._scheduler
        started: tuple[BeamSearch, _native.KvPool] = await asyncio.wrap_future(
            sched.call(
                lambda: self._engine._beam_start(
                    prompt, beam_width, max_tokens, length_penalty, early_stopping
                )
            )
        )
        search, pool = started
        while not await asyncio.wrap_future(sched.call(lambda: search.step(pool))):
            pass
        return search.results(self._engine.detokenize)

    async def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        lora: str | None = None,
        logprobs: int | None = None,
        speculative: str | None = None,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int | None = None,
        **template_kwargs: Any,
    ) -> Completion:
        """Replies to a conversation rendered with the model's chat
        template; the reply comes apart into ``text``, ``reasoning`` and
        ``tool_calls`` exactly as :meth:`Engine.chat
        <oxillama.Engine.chat>` splits it (``reasoning_format`` as there).
        ``reasoning_budget`` caps the tokens of a ``<think>`` reasoning
        (see :class:`~oxillama.decoding.reasoning.ReasoningCap`)."""
        text = self._engine.apply_chat_template(messages, **template_kwargs)
        split = self._engine._reply_split(text, reasoning_format)
        cap = self._engine._reasoning_cap(text, reasoning_budget)
        done = await self.generate(
            self.tokenize(text),
            max_tokens,
            sampler=sampler,
            stop=stop,
            grammar=grammar,
            json_schema=json_schema,
            lora=lora,
            logprobs=logprobs,
            speculative=speculative,
            reasoning_cap=cap,
        )
        return split.apply(done)

    def chat_stream(
        self,
        messages: Sequence[Message],
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        lora: str | None = None,
        logprobs: int | None = None,
        speculative: str | None = None,
        result: list[Completion] | None = None,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int | None = None,
        **template_kwargs: Any,
    ) -> AsyncGenerator[str, None]:
        """Streaming form of :meth:`chat`: the reply's text pieces as the
        model writes them (markers and channels included); ``result``, when
        given, receives the :class:`Completion` that :meth:`chat` returns,
        split the same way. Nothing is rendered, checked or queued until
        the first piece is awaited."""

        def start(whole: list[Completion]) -> tuple[ReplySplit, AsyncGenerator[str, None]]:
            text = self._engine.apply_chat_template(messages, **template_kwargs)
            split = self._engine._reply_split(text, reasoning_format)
            cap = self._engine._reasoning_cap(text, reasoning_budget)
            pieces = self.stream(
                self.tokenize(text),
                max_tokens,
                sampler=sampler,
                stop=stop,
                grammar=grammar,
                json_schema=json_schema,
                result=whole,
                lora=lora,
                logprobs=logprobs,
                speculative=speculative,
                reasoning_cap=cap,
            )
            return split, pieces

        return split_result(start, result)


def _draft_of(value: str | NgramDraft | None, field: str) -> NgramDraft | None:
    if value is None or value == "none":
        return None
    if value == "ngram":
        return NgramDraft(cache=NgramCache())
    if isinstance(value, NgramDraft):
        return value
    raise ParameterError(f"{field} must be 'ngram', 'none', None or an NgramDraft, got {value!r}")
