"""Continuous batching: many generations share one model.

One worker thread owns every running sequence. Each iteration it

1. drops cancelled sequences (their KV pages go back to the pool at once);
2. makes sure the KV pool has a page for every decoding sequence that
   needs one, preempting the newest sequences if it has not (their pages
   are freed and they are recomputed later: the prompt by a normal
   prefill, the tokens already generated row by row with the one-token
   kernel, so the continuation is exactly the one it would have been);
3. samples the next token of every sequence that is decoding and advances
   all of them with **one** batched forward pass (the weights are read once
   for the whole batch);
4. prefills one chunk of one waiting prompt (round robin), so a long prompt
   never stalls the running streams for more than a chunk.

Every sequence's KV cache is a page table into one shared pool of 16-token
pages (``kv_pages`` of them), so memory follows the tokens actually held;
the prefix cache keeps forks of finished prefills, which share their pages
with every request that reuses them (copied on the first write).

Sessions (:class:`Conversation`) are sequences whose pages outlive their
requests: a turn is a request that starts from the session's KV, sampler and
grammar state and hands them back when it ends. Their turns batch and
prefill like any request. An idle session's pages are never dropped; under
pressure the least recently used idle session is hibernated (its KV copied
out of the pool exactly, as bytes) and woken when its next turn starts. A
running turn that must give its pages up is swapped out the same way, never
recomputed, because its earlier context was computed in other chunks.

A request with an n-gram draft (``speculative="ngram"``) feeds its sampled
token and up to ``k`` drafted tokens in the same batched pass, with every
row's logits returned (rows attended one by one with the one-token kernel,
so they are the bits one-token steps give). The next step samples row by
row exactly as without speculation and goes on while the sampled token is
the draft; the KV of the drafts that failed is truncated. The sampler and
grammar see the same tokens in the same order as without speculation, so
the output is the same token for token, seeded sampling too. Session
turns decode without drafts.

With a context shift (``AsyncEngine(context_shift=True, n_keep=N)``), a
sequence whose context is full shifts it as a synchronous engine does (see
``SessionState.shift_for``): a session turn through its session's state, a
one-shot request through the tokens its KV holds. A one-shot request that
shifted and is preempted is recomputed with the same shifts at the same
points (its tokens row by row as they were first evaluated), so its KV
comes back bit for bit.

Results go back through callbacks, which :class:`~oxillama.AsyncEngine`
turns into asyncio futures and queues. The forward passes release the GIL.
Work that must see a session at rest (snapshots, adoption, closing) runs on
the worker between steps, through :meth:`Scheduler.call`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

import oxillama._native as _native
from oxillama.decoding.completion import Completion, FinishReason, Piece, Timings, TokenLogprob
from oxillama.decoding.grammar import Grammar, allowed_bytes
from oxillama.decoding.grammar.budget import Items, sample_within_budget
from oxillama.decoding.logprobs import check_logprobs, token_logprob
from oxillama.decoding.ngram_draft import NgramDraft, NgramState
from oxillama.decoding.reasoning import ReasoningCap
from oxillama.decoding.sampling import SamplerConfig, build_sampler
from oxillama.engine.session_state import (
    ContextShift,
    SessionState,
    check_fits,
    cut_to_kept,
    kept_prefix,
    matcher_for,
)
from oxillama.errors import (
    GenerateError,
    KvCacheFullError,
    OverloadedError,
    OxiLlamaError,
    ParameterError,
)
from oxillama.kv_store.binding import LoraKey, StoreBinding
from oxillama.kv_store.store import import_blocks
from oxillama.serving.mailbox import wakeups_held
from oxillama.serving.prefix_cache import PrefixCache
from oxillama.text.assembler import TextAssembler

#: Positions per KV page (the pool's page size).
PAGE = 16

#: Called from the worker thread with a text piece, or at the end with the
#: completion, or with the error that ended the request.
Emit = Callable[[str | None, Completion | None, BaseException | None], None]


log = logging.getLogger("oxillama.scheduler")


@dataclass(eq=False)
class Conversation:
    """A session living in the scheduler: its state, and the turn using it."""

    id: int
    state: SessionState
    #: Whether its KV pages come from the scheduler's pool (an adopted
    #: engine's session keeps its own private pages until it hibernates).
    pooled: bool
    busy: bool = False
    closed: bool = False
    last_used: float = field(default_factory=time.perf_counter)
    #: Whether its whole context was computed from an empty start under the
    #: base model, unshifted (its KV may then be looked up and stored).
    store_ok: bool = False


@dataclass(eq=False)
class Turn:
    """What a session turn asks for, resolved on the worker when it starts
    (the session's position is only known then)."""

    text: str | None = None
    tokens: list[int] | None = None
    #: A chat's rendered tokens: the common prefix with the session is kept.
    chat: list[int] | None = None
    sampler: SamplerConfig | None = None
    grammar: Grammar | None = None
    logprobs: int | None = None


@dataclass(eq=False)
class PromptShare:
    """Several requests for one prompt (``n`` choices): the first queued is
    the leader and evaluates the prompt; the others start from a fork of
    its prompt KV (shared pages, copied only where written) and its
    last-position logits, so the prompt is evaluated once."""

    leader: Request | None = None
    #: Followers that have not started yet.
    waiting: int = 0
    #: Followers promised but not queued yet: ``generate_n`` queues its
    #: choices one event-loop step apart, and the leader's prompt must not
    #: end up unshared because the worker finished it in between.
    #: ``Scheduler.release_share`` drops the promise of any never queued.
    expected: int = 0
    #: A fork of the leader's prompt KV and the logits after it, once done.
    kv: _native.Session | None = None
    logits: npt.NDArray[np.float32] | None = None
    #: The leader ended before its prompt was done: followers prefill alone.
    failed: bool = False

    def ready(self) -> bool:
        return self.kv is not None or self.failed

    def wanted(self) -> bool:
        """Whether a follower is queued or promised for the prompt KV."""
        return self.waiting > 0 or self.expected > 0

    def drop_if_unwanted(self) -> None:
        """Lets the prompt KV go (its pages return with the last fork) once
        no follower waits for it or is promised."""
        if not self.wanted():
            self.kv = self.logits = None


@dataclass(frozen=True)
class RequestTimes:
    """What a request's latency histograms record, at its completion."""

    #: Arrival to the first work the worker did for it.
    queue_seconds: float
    #: Arrival to its first generated token (None: it generated none).
    first_token_seconds: float | None
    #: Mean time between its generated tokens (None: fewer than two).
    inter_token_seconds: float | None
    #: Arrival to completion.
    e2e_seconds: float
    prompt_tokens: int
    generated_tokens: int
    #: The completion's ``finish_reason`` ("stop", "eos" or "length").
    finish_reason: str = "stop"


@dataclass(eq=False)
class Request:
    """One request's live state."""

    id: int
    prompt: list[int]
    max_tokens: int
    stop: Sequence[str]
    ignore_eos: bool
    sampler: _native.Sampler
    matcher: _native.GrammarMatcher | None
    emit: Emit
    #: The sampler's seed (drawn from the OS for an unseeded config).
    seed: int | None = None
    session: _native.Session | None = None
    fed: int = 0
    logits: npt.NDArray[np.float32] | None = None
    generated: list[int] = field(default_factory=list)
    text: TextAssembler = field(init=False)
    cancelled: bool = False
    t_arrive: float = field(default_factory=time.perf_counter)
    #: After a preemption: the tokens to evaluate again (prompt + generated).
    replay: list[int] | None = None
    #: Prompt tokens the sampler has seen (penalties, DRY): a recomputed
    #: prompt is not fed to it twice.
    seen: int = 0
    preempted: int = 0
    t_prefilled: float = 0.0
    t_first_token: float = 0.0
    #: When the worker first gave the request any work (its queue time ends).
    t_started: float = 0.0
    #: A session turn: the session, and the turn until it has started.
    conv: Conversation | None = None
    turn: Turn | None = None
    #: A stop string ended a session turn: its last token is evaluated
    #: first, as a synchronous engine does, and the turn ends next step.
    stop_next: bool = False
    #: A turn's sampled token not yet evaluated when it was swapped out.
    pending: int | None = None
    #: Of this turn's evaluated tokens (``prompt[:fed] + generated``), how
    #: many a context shift already moved into its session's tokens (for a
    #: one-shot request: into ``window``).
    absorbed: int = 0
    #: A one-shot request that shifted its context: the tokens its KV holds
    #: of its first ``absorbed`` evaluated tokens (None: it has not shifted).
    window: list[int] | None = None
    #: The turn's state went back to its session (exactly once, whether it
    #: finished, failed or was cancelled, and whoever saw that first).
    handed_back: bool = False
    #: LoRA adapters and scales of this request (applied to its rows only;
    #: its prompt bypasses the prefix cache, whose KV is the base model's).
    lora: tuple[tuple[_native.LoraAdapter, float], ...] = ()
    #: The prefix store's key of ``lora`` (each adapter file's digest and
    #: its scale): its blocks are stored and found under it alone.
    lora_key: LoraKey = ()
    #: A session turn's context length at its prompt's end less one (the
    #: partial block a later lookup of it asks for); -1: not stored.
    store_mark: int = -1
    #: ``logprobs=k`` of the request (None: none reported), the entries
    #: so far, and how many of them went out with streamed pieces.
    logprobs: int | None = None
    lps: list[TokenLogprob] = field(default_factory=list)
    lps_sent: int = 0
    share: PromptShare | None = None
    #: Under a grammar, keep the text completable within ``max_tokens``
    #: (see :mod:`oxillama.decoding.grammar.budget`), and whether that chose tokens.
    grammar_budget: bool = True
    forced: bool = False
    #: Under a grammar that is a run of items (parallel tool calls): their
    #: sizes so far, which decide whether another may begin.
    items: Items | None = None
    #: A grammar that starts to apply after the first occurrence of its
    #: trigger text in the output (a lazy grammar), and where to look next.
    lazy: tuple[str, Grammar] | None = None
    lazy_from: int = 0
    #: A cap on the reply's reasoning, and the tokens it forces next.
    cap: ReasoningCap | None = None
    forcing: list[int] = field(default_factory=list)

    def follows(self) -> bool:
        """A choice that waits for its leader's prompt KV."""
        sh = self.share
        return sh is not None and sh.leader is not self and self.fed == 0 and self.replay is None

    #: The n-gram draft's index of this request's tokens (None: no drafts).
    spec: NgramState | None = None
    #: Drafts evaluated after the last sampled token, and the logits of each
    #: row of that pass (the sampled token's, then each draft's).
    drafts: list[int] = field(default_factory=list)
    rows: npt.NDArray[np.float32] | None = None
    #: The proposal the drafts came from and its match length (feedback).
    proposal: list[int] = field(default_factory=list)
    match_n: int = 0
    #: Draft positions in the KV past the row being sampled.
    spec_extra: int = 0

    def __post_init__(self) -> None:
        self.text = TextAssembler(self.stop)

    def piece(self, text: str) -> str:
        """``text`` to emit, carrying the logprobs not sent yet."""
        if self.logprobs is None:
            return text
        new = tuple(self.lps[self.lps_sent :])
        self.lps_sent = len(self.lps)
        return Piece(text, new)


@dataclass
class Metrics:
    """Counters since the scheduler started (see :meth:`Scheduler.metrics`)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    #: Seconds the scheduler thread spent in its steps outside forward
    #: passes: sampling, grammar masks, detokenizing, queueing the pieces,
    #: the KV bookkeeping. Against decode_seconds it says what the
    #: host-side work costs each step.
    host_seconds: float = 0.0
    finished: int = 0
    cancelled: int = 0
    preempted: int = 0
    session_turns: int = 0
    session_decode_tokens: int = 0
    #: Decode steps whose one forward pass held session turns and other
    #: requests together.
    mixed_decode_steps: int = 0
    hibernated: int = 0
    woken: int = 0
    swapped: int = 0
    #: Prompt tokens a choice took from its leader instead of evaluating.
    shared_prompt_tokens: int = 0
    #: Speculative decoding: steps that verified drafts, drafts verified,
    #: drafts accepted.
    spec_steps: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0


class Scheduler:
    """The batching worker for one model (see the module docstring)."""

    def __init__(
        self,
        model: _native.Model,
        tokenizer: Any,
        vocab_size: int,
        *,
        context_size: int,
        threads: int | None,
        kv_dtype: str = "f16",
        max_batch: int = 8,
        prefill_chunk: int = 64,
        max_queue: int = 256,
        prefix_cache_bytes: int = 256 << 20,
        kv_pages: int | None = None,
        context_shift: ContextShift | None = None,
        kv_store: StoreBinding | None = None,
    ) -> None:
        if max_batch < 1 or prefill_chunk < 1 or max_queue < 1:
            raise ParameterError("max_batch, prefill_chunk and max_queue must be at least 1")
        per_context = -(-context_size // PAGE)
        if kv_pages is None:
            kv_pages = max_batch * per_context
        if kv_pages < per_context:
            raise ParameterError(
                f"kv_pages={kv_pages} cannot hold one full context of {context_size} tokens "
                f"({per_context} pages of {PAGE})"
            )
        self._pool = _native.KvPool(model, kv_pages, kv_dtype)
        self._page_bytes = self._pool.nbytes // kv_pages
        self._model = model
        self._tokenizer = tokenizer
        self._vocab = vocab_size
        self._n_ctx = context_size
        self._threads = threads
        self._kv_dtype = kv_dtype
        #: What a one-shot request does when its context is full (None: it
        #: ends with "length"); sessions carry their own.
        self._shift = context_shift
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.max_queue = max_queue
        self._ids = itertools.count()
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._cv = threading.Condition()
        self._closed = False
        self._metrics = Metrics()
        self._observers: list[Callable[[RequestTimes], None]] = []
        #: Pool pages promised to this step's evaluations, and the step's
        #: expected tokens and rows so far (see `_draft`).
        self._reserved = 0
        self._plan = (0.0, 0)
        # A recurrent model's state cannot be shared up to an arbitrary
        # block boundary the way KV pages are, so its prefix cache is off
        # (``metrics()["prefix_cache"]`` says so).
        self._recurrent = bool(model.config().get("recurrent", False))
        self.prefix = (
            PrefixCache(prefix_cache_bytes)
            if prefix_cache_bytes > 0 and not self._recurrent
            else None
        )
        #: The prefix store below the prefix cache (None: none): requests
        #: and session turns without adapters restore their prompt's stored
        #: blocks and store their blocks when they finish.
        self.store = kv_store
        #: Live sessions (busy or idle), by id; guarded by ``_cv``.
        self._convs: dict[int, Conversation] = {}
        self._jobs: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._jobs = collections.deque()
        self._thread = threading.Thread(target=self._loop, name="oxillama-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ requests

    def submit(
        self,
        prompt: list[int],
        max_tokens: int,
        sampler: SamplerConfig,
        *,
        stop: Sequence[str],
        ignore_eos: bool,
        grammar: Grammar | None,
        emit: Emit,
        lora: tuple[tuple[_native.LoraAdapter, float], ...] = (),
        lora_key: LoraKey = (),
        logprobs: int | None = None,
        share: PromptShare | None = None,
        grammar_budget: bool = True,
        lazy: tuple[str, Grammar] | None = None,
        draft: NgramDraft | None = None,
        cap: ReasoningCap | None = None,
    ) -> Request:
        """Queues a request; raises at once if it can never be served.
        Requests given one ``share`` (and the same prompt and adapters)
        evaluate their prompt once; ``draft`` makes it decode speculatively
        with n-gram drafts; ``cap`` caps its reasoning."""
        if not prompt:
            raise GenerateError("empty prompt: a request needs at least one token")
        # With a context shift a prompt may fill the context (the shift
        # makes room for the first token), as in a synchronous engine.
        if len(prompt) > self._n_ctx or (len(prompt) == self._n_ctx and self._shift is None):
            why = (
                "a context shift makes room for generated tokens, not for a longer prompt"
                if self._shift is not None
                else "at least one must be left to generate"
            )
            raise GenerateError(
                f"prompt of {len(prompt)} tokens does not fit in the context of "
                f"{self._n_ctx} tokens ({why})"
            )
        if draft is not None and self._recurrent:
            # A batched pass keeps a recurrent state only where it starts,
            # so failed drafts could not be given back.
            raise ParameterError(
                "speculative decoding in the scheduler needs an attention model; "
                "this model is recurrent"
            )
        sampler = sampler.seeded()
        seq = Request(
            id=next(self._ids),
            prompt=prompt,
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            seed=sampler.seed,
            sampler=build_sampler(sampler, self._tokenizer, self._vocab),
            matcher=None if grammar is None else grammar.matcher(self._tokenizer),
            emit=emit,
            lora=lora,
            lora_key=lora_key,
            logprobs=check_logprobs(logprobs),
            grammar_budget=bool(grammar_budget),
            lazy=lazy,
            spec=None if draft is None else draft.new_state(prompt),
            items=Items.of(grammar),
            cap=cap,
        )
        if lazy is not None and grammar is not None:
            raise ParameterError("a request has a grammar or a lazy grammar, not both")
        with self._cv:
            if self._closed:
                raise GenerateError("the engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise OverloadedError(f"overloaded: {len(self._waiting)} requests are waiting")
            if share is not None:
                lead = share.leader
                if lead is not None and (lead.prompt != prompt or lead.lora != lora):
                    raise ParameterError("requests sharing a prompt need the same prompt and LoRA")
                seq.share = share
                if lead is None:
                    share.leader = seq
                else:
                    share.waiting += 1
                    share.expected = max(0, share.expected - 1)
            self._waiting.append(seq)
            self._cv.notify()
        return seq

    # ------------------------------------------------------------ sessions

    def pool_kv(
        self, model: Any, n_ctx: int, threads: int | None, kv_dtype: str
    ) -> _native.Session:
        """A native session drawing its pages from this scheduler's pool (no
        pages are taken until it evaluates or imports), of at most the
        scheduler's context size (the pool is sized in those). Its KV types
        are the pool's, whatever ``kv_dtype`` asks: a snapshot of other
        types is converted on restore."""
        if model.native is not self._model:
            raise ParameterError("this session's model is not the scheduler's model")
        n_ctx = min(n_ctx, self._n_ctx)
        del kv_dtype
        kv = _native.Session(self._model, n_ctx, self._threads, self._kv_dtype, pool=self._pool)
        kv.prefill_chunk = self.prefill_chunk
        return kv

    def open_session(self, state: SessionState) -> Conversation:
        """Registers a session; its pages (if any) stay pinned until it closes."""
        pooled = state.kv.in_pool(self._pool)
        with self._cv:
            if self._closed:
                raise GenerateError("the engine is closed")
            conv = Conversation(id=next(self._ids), state=state, pooled=pooled)
            self._convs[conv.id] = conv
        return conv

    def close_session(self, conv: Conversation) -> None:
        """Forgets a session and frees its pages at once (any thread; a turn
        in flight is cancelled first)."""
        with self._cv:
            conv.closed = True
            self._convs.pop(conv.id, None)
            for q in [*self._running, *self._waiting]:
                if q.conv is conv:
                    q.cancelled = True
            self._cv.notify()
        if not conv.busy:
            # Not in a turn: nothing else touches it, so its pages go now.
            self.call(lambda: None if conv.busy else self._drop(conv))

    @staticmethod
    def _drop(conv: Conversation) -> None:
        conv.state.kv.truncate(0)
        conv.state.swapped = None

    def submit_turn(
        self,
        conv: Conversation,
        turn: Turn,
        max_tokens: int,
        *,
        stop: Sequence[str],
        ignore_eos: bool,
        emit: Emit,
        logprobs: int | None = None,
        lazy: tuple[str, Grammar] | None = None,
        cap: ReasoningCap | None = None,
    ) -> Request:
        """Queues a session turn (the caller runs one turn of a session at a
        time); its prompt is resolved when it starts. ``lazy`` is a grammar
        that applies from its trigger text on, and ``cap`` caps the
        reasoning, as in :meth:`submit`."""
        if lazy is not None and turn.grammar is not None:
            raise ParameterError("a request has a grammar or a lazy grammar, not both")
        if conv.closed:
            raise GenerateError("this session is closed")
        seq = Request(
            id=next(self._ids),
            prompt=[],
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            sampler=conv.state.sampler,
            seed=conv.state.sampler_config.seed,
            matcher=None,
            emit=emit,
            conv=conv,
            turn=turn,
            logprobs=check_logprobs(logprobs),
            lazy=lazy,
            cap=cap,
        )
        with self._cv:
            if self._closed:
                raise GenerateError("the engine is closed")
            if len(self._waiting) >= self.max_queue:
                raise OverloadedError(f"overloaded: {len(self._waiting)} requests are waiting")
            conv.busy = True
            self._waiting.append(seq)
            self._cv.notify()
        return seq

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Runs ``fn`` on the worker between two steps (when no forward pass
        is running and no session is being changed); its result or error
        goes to the returned future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                fut.set_exception(GenerateError("the engine is closed"))
                return fut
            self._jobs.append((fn, fut))
            self._cv.notify()
        return fut

    def release_share(self, share: PromptShare) -> None:
        """Drops the promise of followers that were never queued (their
        request failed or was cancelled first); the leader's prompt KV goes
        back to the pool once no queued follower waits for it."""
        with self._cv:
            share.expected = 0
            share.drop_if_unwanted()

    def cancel(self, seq: Request) -> None:
        with self._cv:
            seq.cancelled = True
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
        if self.store is not None:
            self.store.store.close()  # a graceful stop stores what is queued

    def metrics(self) -> dict[str, float | int]:
        m = self._metrics
        with self._cv:
            queued = len(self._waiting)
            running = len(self._running)
            kv_seqs = sum(1 for s in self._running if s.session is not None)
            convs = list(self._convs.values())
        pool = self._pool
        return {
            "prompt_tokens": m.prompt_tokens,
            "generated_tokens": m.generated_tokens,
            "prefill_seconds": m.prefill_seconds,
            "decode_seconds": m.decode_seconds,
            "prompt_tokens_per_second": m.prompt_tokens / m.prefill_seconds
            if m.prefill_seconds
            else 0.0,
            "decode_tokens_per_second": m.generated_tokens / m.decode_seconds
            if m.decode_seconds
            else 0.0,
            "decode_steps": m.decode_steps,
            "host_seconds": m.host_seconds,
            "queue_length": queued,
            "running": running,
            "sequences_with_kv": kv_seqs,
            "finished": m.finished,
            "cancelled": m.cancelled,
            "preempted": m.preempted,
            "shared_prompt_tokens": m.shared_prompt_tokens,
            "kv_pages_total": pool.n_pages,
            "kv_pages_free": pool.free_pages,
            "kv_pages_used": pool.n_pages - pool.free_pages,
            "kv_page_tokens": PAGE,
            "kv_page_bytes": self._page_bytes,
            "sessions": len(convs),
            "sessions_hibernated": sum(1 for c in convs if c.state.swapped is not None),
            "session_turns": m.session_turns,
            "session_decode_tokens": m.session_decode_tokens,
            "mixed_decode_steps": m.mixed_decode_steps,
            "session_hibernations": m.hibernated,
            "session_wakes": m.woken,
            "session_swaps": m.swapped,
            "speculative_steps": m.spec_steps,
            "speculative_drafted_tokens": m.spec_drafted,
            "speculative_accepted_tokens": m.spec_accepted,
            "speculative_acceptance_rate": m.spec_accepted / m.spec_drafted
            if m.spec_drafted
            else 0.0,
            **self._prefix_metrics(),
            **self._store_metrics(),
        }

    def _store_metrics(self) -> dict[str, float | int]:
        """The prefix store's counts per tier; the prefix cache is its
        memory tier."""
        out: dict[str, float | int] = {}
        p = self.prefix
        if p is not None:
            out = {
                "kv_store_hits_memory": p.hits,
                "kv_store_misses_memory": p.misses,
                "kv_store_corrupt_blocks_memory": 0,  # shared pages, nothing to check
                "kv_store_tokens_saved_memory": p.hit_tokens,
                "kv_store_bytes_saved_memory": p.hit_tokens * self._page_bytes // PAGE,
            }
        if self.store is not None:
            out.update(self.store.store.metrics())
        return out

    def _prefix_metrics(self) -> dict[str, float | int]:
        p = self.prefix
        # Numbers only, so they export as gauges; `recurrent_model` says why
        # the cache is off when it is.
        flags: dict[str, float | int] = {
            "prefix_cache_enabled": int(p is not None),
            "recurrent_model": int(self._recurrent),
        }
        if p is None:
            return flags
        looked = p.hits + p.misses
        return {
            **flags,
            "prefix_cache_hits": p.hits,
            "prefix_cache_misses": p.misses,
            "prefix_cache_hit_rate": p.hits / looked if looked else 0.0,
            "prefix_cache_hit_tokens": p.hit_tokens,
            "prefix_cache_entries": p.entries,
            "prefix_cache_bytes": p.bytes_used,
        }

    # -------------------------------------------------------------- worker

    def _loop(self) -> None:
        while True:
            with self._cv:
                while (
                    not self._closed and not self._waiting and not self._running and not self._jobs
                ):
                    self._cv.wait()
                if self._closed:
                    for s in self._running:
                        if s.conv is None:
                            self._to_store(s)  # a graceful stop keeps what was computed
                    for s in [*self._running, *self._waiting]:
                        s.emit(None, None, GenerateError("the engine was closed"))
                    for _, fut in self._jobs:
                        fut.set_exception(GenerateError("the engine was closed"))
                    self._running.clear()
                    self._waiting.clear()
                    self._jobs.clear()
                    return
                jobs = list(self._jobs)
                self._jobs.clear()
                while self._waiting and len(self._running) < self.max_batch:
                    self._running.append(self._waiting.popleft())
                cancelled = [s for s in self._running if s.cancelled]
                self._running = [s for s in self._running if not s.cancelled]
                batch = list(self._running)
            for fn, fut in jobs:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:
                        fut.set_exception(e)
            for s in cancelled:
                self._metrics.cancelled += 1
                if s.conv is not None:
                    self._end_turn(s)
                else:
                    # What it evaluated is as good as a finished request's
                    # (a client that hangs up after the first token, say).
                    self._to_store(s)
                s.session = None  # its KV memory is released here
            m = self._metrics
            passes = m.decode_seconds + m.prefill_seconds
            t = time.perf_counter()
            try:
                self._step(batch)
            except BaseException as e:  # a bug must not hang every caller
                for s in batch:
                    self._finish(s, None, e)
            spent = time.perf_counter() - t
            m.host_seconds += max(0.0, spent - (m.decode_seconds + m.prefill_seconds - passes))

    def _step(self, batch: list[Request]) -> None:
        decoding = [s for s in batch if s.logits is not None and s.session is not None]
        self._make_room(batch, decoding)
        decoding = [s for s in decoding if s.logits is not None and s.session is not None]
        advance: list[tuple[Request, int]] = []
        with wakeups_held():  # the loops wake once, as the pass starts
            for s in decoding:
                tok = self._verify(s) if s.spec is not None else self._sample(s)
                if tok is not None:
                    advance.append((s, tok))
        if advance:
            # Pages every plain step needs come first (`_make_room` made
            # sure they are free); drafts take only what is left.
            self._reserved = sum(self._need(s.session, 1) for s, _ in advance)
            # Drafts are chosen for the whole pass: its rows and expected
            # tokens so far decide what a sequence's drafts are worth.
            self._plan = (float(len(advance)), len(advance))
            feeds = [[tok, *self._draft(s)] for s, tok in advance]
            wide = [len(f) > 1 for f in feeds]
            t = time.perf_counter()
            sessions = [s.session for s, _ in advance]
            for (s, _), w in zip(advance, wide, strict=True):
                if w:  # verification rows must equal one-token steps
                    s.session.exact_rows = True  # type: ignore[union-attr]
            try:
                logits = _native.eval_batch(sessions, feeds, wide if any(wide) else None)  # type: ignore[arg-type]
            except KvCacheFullError:
                # `_make_room` counted the pages, so this is not expected;
                # the sampled tokens are already emitted, so their sequences
                # are recomputed (with them) rather than failed; a session
                # turn evaluates its token when it is swapped back in.
                for q, tok in advance:
                    if q.conv is not None:
                        q.pending, q.logits = tok, None
                    self._preempt(q)
                return
            finally:
                for (s, _), w in zip(advance, wide, strict=True):
                    if w and s.session is not None:
                        s.session.exact_rows = False
            m = self._metrics
            m.decode_seconds += time.perf_counter() - t
            m.decode_steps += 1
            turns = sum(1 for s, _ in advance if s.conv is not None)
            m.session_decode_tokens += turns
            if 0 < turns < len(advance):
                m.mixed_decode_steps += 1
            row = 0
            for (s, _), feed in zip(advance, feeds, strict=True):
                if len(feed) > 1:
                    s.drafts = feed[1:]
                    s.rows = logits[row : row + len(feed)]
                    s.logits = s.rows[0]
                    row += len(feed)
                else:
                    s.logits = logits[row]
                    row += 1
        prefilling = [
            s
            for s in batch
            if (s.logits is None or s.session is None)
            and not s.cancelled
            and not (s.follows() and s.share is not None and not s.share.ready())
        ]
        if prefilling:
            # Requests not started yet first (a short request's first token
            # never waits behind a long prompt), then the one that has waited
            # longest; the first that has room takes one chunk.
            order = sorted(prefilling, key=lambda q: (q.fed > 0, q.t_arrive))
            for s in order:
                if self._may_take_pages(s, prefilling) and self._prefill_chunk(s):
                    break
            else:
                if not advance:
                    self._unjam(batch)

    # ---------------------------------------------------------- speculation

    def _draft(self, s: Request) -> list[int]:
        """Drafts to evaluate after ``s``'s newly sampled token: the n-gram
        proposal, cut to what the context, ``max_tokens`` and the free KV
        pages allow."""
        ng, kv = s.spec, s.session
        if ng is None or kv is None:
            return []
        ng.extend(s.generated[len(ng.tokens) - len(s.prompt) :])
        room = min(kv.n_ctx - kv.n_past - 1, s.max_tokens - len(s.generated))
        tokens, rows = self._plan
        s.match_n, s.proposal, drafts, gain = ng.propose(room, tokens, rows)
        extra = self._need(kv, 1 + len(drafts)) - self._need(kv, 1)
        if extra > self._pool.free_pages - self._reserved:
            return []  # drafts never take pages a plain step needs
        self._reserved += extra
        self._plan = (tokens + gain, rows + len(drafts))
        return drafts

    def _verify(self, s: Request) -> int | None:
        """Samples ``s``'s rows in order (one row when it drafted nothing),
        as plain steps would, while each sampled token is the draft;
        truncates the failed drafts' KV. Returns the token to evaluate next
        (None when the request ended)."""
        assert s.logits is not None and s.session is not None
        drafts = s.drafts
        rows = s.rows if s.rows is not None else s.logits[None, :]
        s.rows, s.drafts = None, []
        new: list[int] = []
        tok: int | None = None
        for j in range(len(drafts) + 1):
            s.logits = rows[j]
            s.spec_extra = len(drafts) - j
            tok = self._sample(s)
            if tok is None:
                break
            new.append(tok)
            if j == len(drafts) or tok != drafts[j]:
                break
        s.spec_extra = 0
        accepted = max(0, len(new) - 1) if tok is not None else len(new)
        if drafts:
            m = self._metrics
            m.spec_steps += 1
            m.spec_drafted += len(drafts)
            m.spec_accepted += min(accepted, len(drafts))
        if s.spec is not None:
            # Also after a step without drafts: whether the proposal's first
            # token was right is what lets drafting start.
            s.spec.feedback(s.match_n, s.proposal, len(drafts), new)
            s.proposal = []
        if tok is not None and s.session is not None:
            cut_to_kept(s.session, s.session.n_past - (len(drafts) - accepted))
        return tok

    def _chunk(self, s: Request) -> list[int]:
        """The tokens of ``s``'s next prefill chunk."""
        tokens = s.prompt if s.replay is None else s.replay
        in_prompt = s.fed < len(s.prompt)
        end = min(s.fed + self.prefill_chunk, len(s.prompt) if in_prompt else len(tokens))
        kv = s.session
        if not in_prompt and kv is not None:
            # A recomputation goes up to the next context shift, at most.
            end = min(end, s.fed + max(0, int(kv.n_ctx) - int(kv.n_past)))
        return tokens[s.fed : end]

    def _need(self, kv: _native.Session | None, n: int) -> int:
        """Pool pages ``kv`` would take to append ``n`` positions (none for
        a session on private pages)."""
        if kv is None or not kv.in_pool(self._pool):
            return 0
        return int(kv.pages_needed(n))

    def _pages_for_chunk(self, s: Request) -> int:
        if s.conv is not None and s.session is None:
            return self._wake_pages(s.conv)
        n = len(self._chunk(s))
        if s.session is None:
            return -(-n // PAGE)
        return self._need(s.session, n)

    def _wake_pages(self, conv: Conversation) -> int:
        sw = conv.state.swapped
        return -(-sw[0] // PAGE) if sw is not None and conv.pooled else 0

    def _may_take_pages(self, s: Request, prefilling: list[Request]) -> bool:
        """Free pages go to the oldest started prefill first: ``s`` may take
        some only if enough are left for every older one that needs more.
        Without this, requests not started yet (which go first, for their
        first token) took each freed page from sequences that had been
        waiting longer, and a full pool could cycle forever."""
        need = self._pages_for_chunk(s)
        if need == 0:
            return True
        reserve = sum(
            self._pages_for_chunk(q)
            for q in prefilling
            if q.t_arrive < s.t_arrive and self._holds_pages(q)
        )
        return need + reserve <= self._pool.free_pages or not reserve

    def _unjam(self, batch: list[Request]) -> None:
        """Nothing decodes and no prefill has room: every page is held by
        sequences that each wait for more. The newest holder gives its pages
        up (it is recomputed later); the freed pages go to the oldest (see
        `_may_take_pages`), which so advances at least a chunk per jam; one
        context always fits in the pool, so it finishes and frees its pages."""
        if self._hibernate_one():
            return
        holders = [q for q in batch if self._holds_pages(q) and not q.cancelled]
        if len(holders) > 1:
            self._preempt(max(holders, key=lambda q: q.t_arrive))

    def _holds_pages(self, s: Request) -> bool:
        kv = s.session
        if kv is None and s.conv is not None and s.conv.state.swapped is None:
            kv = s.conv.state.kv  # a turn not started yet: its session's pages
        return kv is not None and kv.in_pool(self._pool) and kv.pages_held > 0

    def _make_room(self, batch: list[Request], decoding: list[Request]) -> None:
        """Frees KV pages until every decoding sequence can take its next
        position: prefix-cache entries first, then the newest sequences."""
        need = sum(self._step_need(s) for s in decoding)
        while need > self._pool.free_pages:
            if self.prefix is not None and self.prefix.evict_one():
                continue
            if self._hibernate_one():
                continue
            # Any sequence holding pages may go, a half-prefilled one too;
            # the oldest stays (one sequence always fits: kv_pages >= one
            # context).
            holders = [s for s in batch if self._holds_pages(s)]
            if len(holders) <= 1:
                return
            victim = max(holders, key=lambda q: q.t_arrive)
            if victim.logits is not None:
                need -= self._step_need(victim)
            self._preempt(victim)

    def _step_need(self, s: Request) -> int:
        """Pool pages a decoding sequence's next step takes. A full context
        takes none: the sequence shifts it (which gives pages back) or ends.
        Counting a page past the context for it would preempt others, or
        itself, for a page nobody uses."""
        kv = s.session
        if kv is not None and kv.n_past >= kv.n_ctx and not s.drafts:
            return 0
        return self._need(kv, 1)

    def _hibernate_one(self, keep: Conversation | None = None) -> bool:
        """Hibernates the least recently used idle session holding pool
        pages (its KV is copied out exactly); False when there is none.
        Runs on the worker, the only thread that touches a session's state."""
        with self._cv:
            # A session whose next turn waits in the queue is idle too: the
            # turn wakes it when it starts.
            active = {id(q.conv) for q in self._running if q.conv is not None}
            idle = [
                c
                for c in self._convs.values()
                if id(c) not in active
                and c.pooled
                and c is not keep
                and c.state.swapped is None
                and c.state.kv.pages_held
            ]
        if not idle:
            return False
        min(idle, key=lambda c: c.last_used).state.hibernate()
        self._metrics.hibernated += 1
        return True

    def _room(self, need: int, keep: Conversation | None) -> bool:
        """Frees pool pages until ``need`` are free, without touching a
        running sequence: prefix-cache entries, then idle sessions."""
        while need > self._pool.free_pages:
            if self.prefix is not None and self.prefix.evict_one():
                continue
            if not self._hibernate_one(keep):
                return False
        return True

    def _preempt(self, s: Request) -> None:
        """Frees a sequence's pages; it is recomputed when pages are free.
        A session turn is swapped out instead (exact, see the module doc)."""
        if s.conv is not None:
            s.conv.state.hibernate()
            s.session = None
            s.preempted += 1
            self._metrics.swapped += 1
            return
        s.session = None
        s.logits = None
        s.rows, s.drafts = None, []
        s.fed = 0
        s.replay = s.prompt + s.generated if s.generated else None
        s.window, s.absorbed = None, 0
        s.preempted += 1
        self._metrics.preempted += 1

    def _prefill_chunk(self, s: Request) -> bool:
        """Feeds ``s`` its next chunk; False when the pool had no room for it
        (nothing changed then), True otherwise."""
        if not s.t_started:
            s.t_started = time.perf_counter()
        if s.conv is not None:
            return self._turn_chunk(s)
        replay = s.replay
        tokens = s.prompt if replay is None else replay
        if s.session is None and s.follows() and s.share is not None and s.share.kv is not None:
            self._start_from_leader(s, s.share)
            return True
        if s.session is None:
            s.session = _native.Session(
                self._model, self._n_ctx, self._threads, self._kv_dtype, pool=self._pool
            )
            s.session.prefill_chunk = self.prefill_chunk
            if s.lora:
                s.session.set_loras(list(s.lora))
            elif self.prefix is not None:
                n, cached = self.prefix.lookup(s.prompt)
                if isinstance(cached, _native.Session):
                    # A shared prefix (a system prompt, say) is not evaluated
                    # again: the new session holds the cached pages.
                    s.session = cached.fork(n)
                    s.session.prefill_chunk = self.prefill_chunk
                    self._feed_sampler(s, n)
                    s.fed = n
            if self.store is not None and replay is None:
                self._from_store(s)
        # The prompt goes through the normal prefill; tokens generated before
        # a preemption are evaluated row by row as they first were, and the
        # context shifted where it first was: before a token that found it full.
        in_prompt = s.fed < len(s.prompt)
        if not in_prompt and self._shift is not None and s.session.n_past >= s.session.n_ctx:
            if not self._shift_request(s):
                if any(q is not s and self._holds_pages(q) for q in self._running):
                    return False  # wait for the running sequences to free pages
                self._finish(s, None, KvCacheFullError("the KV pool cannot hold this request"))
                return True
        part = self._chunk(s)
        end = s.fed + len(part)
        while s.session.pages_needed(len(part)) > self._pool.free_pages:
            if self.prefix is not None and self.prefix.evict_one():
                continue
            if not any(q is not s and q.session is not None for q in self._running):
                # Alone, with the prefix cache empty, and still no room.
                self._finish(s, None, KvCacheFullError("the KV pool cannot hold this request"))
                return True
            return False  # wait for the running sequences to free pages
        t = time.perf_counter()
        s.session.exact_rows = not in_prompt
        try:
            out = s.session.eval(np.asarray(part, dtype=np.uint32), False)
        except KvCacheFullError:
            return False  # counted above, so not expected; wait like above
        finally:
            s.session.exact_rows = False
        self._metrics.prefill_seconds += time.perf_counter() - t
        if in_prompt:
            self._metrics.prompt_tokens += max(0, end - max(s.fed, s.seen))
            self._feed_sampler(s, end)
        s.fed += len(part)
        if s.fed == len(tokens):
            s.logits = out
            sh = s.share
            if sh is not None and sh.leader is s and not s.generated and sh.kv is None:
                if sh.wanted():
                    sh.kv, sh.logits = s.session.fork(len(s.prompt)), out.copy()
                else:
                    sh.failed = True  # nobody left to share with
            s.replay = None
            if replay is None:
                s.t_prefilled = time.perf_counter()
            if self.prefix is not None and replay is None and not s.lora:
                n = self.prefix.wants(s.prompt)
                if n:
                    fork = s.session.fork(n)
                    self.prefix.store(s.prompt, n, fork, fork.pages_held * self._page_bytes)
        return True

    def _from_store(self, s: Request) -> None:
        """Restores the stored blocks of ``s``'s prompt past what its
        session holds (a prefix cache hit, or nothing) into a new session,
        when the pool has room for them; a store that fails is a miss."""
        assert self.store is not None and s.session is not None
        try:
            got = self.store.fetch(s.prompt, s.fed, s.lora_key)
        except Exception:  # a bug in a tier must not fail the request
            log.exception("kv_store: lookup failed; prefilling instead")
            return
        if got is None:
            return
        n = got[0]
        need = -(-n // PAGE)
        while need > self._pool.free_pages - self._reserved:
            if self.prefix is None or not self.prefix.evict_one():
                return  # no room: the prompt is prefilled instead
        kv = _native.Session(
            self._model, self._n_ctx, self._threads, self._kv_dtype, pool=self._pool
        )
        kv.prefill_chunk = self.prefill_chunk
        if s.lora:
            kv.set_loras(list(s.lora))
        try:
            import_blocks(kv, got, 0)
        except OxiLlamaError:
            log.exception("kv_store: importing %d stored positions failed; prefilling instead", n)
            return
        s.session = kv
        self._feed_sampler(s, n)
        s.fed = n

    def _to_store(self, s: Request) -> None:
        """Stores the blocks of a finished one-shot request (its prompt and
        what it generated) that the store lacks."""
        kv = s.session
        if self.store is None or kv is None or s.conv is not None:
            return
        if s.window is not None or s.replay is not None:
            return  # shifted, or cut short mid-recomputation
        try:
            # A partial block up to where a lookup of this prompt stops.
            self.store.save(s.prompt + s.generated, kv, (len(s.prompt) - 1,), s.lora_key)
        except Exception:
            log.exception("kv_store: storing a response's blocks failed")

    def _start_from_leader(self, s: Request, sh: PromptShare) -> None:
        """A follower's prompt: a fork of the leader's, and its logits."""
        assert sh.kv is not None and sh.logits is not None
        s.session = sh.kv.fork(len(s.prompt))
        s.session.prefill_chunk = self.prefill_chunk
        if s.lora:
            s.session.set_loras(list(s.lora))
        self._feed_sampler(s, len(s.prompt))
        s.fed = len(s.prompt)
        s.logits = sh.logits.copy()
        s.t_prefilled = time.perf_counter()
        with self._cv:
            sh.waiting -= 1
            sh.drop_if_unwanted()
        self._metrics.shared_prompt_tokens += len(s.prompt)

    # --------------------------------------------------------- session turns

    def _turn_chunk(self, s: Request) -> bool:
        """A session turn's next piece of work: waking its session, starting
        the turn, evaluating a pending token, or one prompt chunk."""
        conv = s.conv
        assert conv is not None
        st = conv.state
        if s.session is None:
            if not self._room(self._wake_pages(conv), conv):
                return self._no_room(s)
            if st.swapped is not None:
                st.wake()
                self._metrics.woken += 1
            s.session = st.kv
        kv = s.session
        if s.turn is not None:
            try:
                self._start_turn(s)
            except (OxiLlamaError, ValueError) as e:
                self._finish(s, None, e)
                return True
            if s.logits is not None:
                return True  # an empty prompt: it decodes from the next step
            self._turn_from_store(s)
        if s.pending is not None:
            if not self._room(self._need(kv, 1), conv):
                return self._no_room(s)
            kv.exact_rows = True  # as the one-token decode it replaces
            try:
                s.logits = kv.eval(np.asarray([s.pending], dtype=np.uint32), False)
            finally:
                kv.exact_rows = False
            s.pending = None
            return True
        if s.logits is not None:
            return True  # swapped out while decoding, now back
        part = s.prompt[s.fed : s.fed + self.prefill_chunk]
        if not self._room(self._need(kv, len(part)), conv):
            return self._no_room(s)
        t = time.perf_counter()
        out = kv.eval(np.asarray(part, dtype=np.uint32), False)
        self._metrics.prefill_seconds += time.perf_counter() - t
        end = s.fed + len(part)
        self._metrics.prompt_tokens += max(0, end - max(s.fed, s.seen))
        self._feed_sampler(s, end)
        s.fed = end
        if s.fed == len(s.prompt):
            s.logits = out
            s.t_prefilled = time.perf_counter()
        return True

    def _turn_from_store(self, s: Request) -> None:
        """Restores the stored blocks that extend a session's context along
        its turn's prompt (a session whose KV is all the base model's,
        computed from an empty context and never shifted)."""
        conv = s.conv
        assert conv is not None and s.session is not None
        st = conv.state
        if self.store is None:
            return
        if s.lora or st.loras or st.shifts:
            conv.store_ok = False
            return
        if st.n_past == 0:
            conv.store_ok = True
        if not conv.store_ok:
            return
        held = list(st.tokens[: st.n_past])
        full = held + s.prompt
        s.store_mark = len(full) - 1
        try:
            got = self.store.fetch(full, st.n_past)
        except Exception:
            log.exception("kv_store: lookup failed; prefilling instead")
            return
        if got is None:
            return
        n = got[0]
        kv = s.session
        if not self._room(max(0, -(-n // PAGE) - kv.pages_held), conv):
            return  # no room: the prompt is prefilled instead
        try:
            import_blocks(kv, got, st.n_past)
        except OxiLlamaError:
            log.exception("kv_store: importing %d stored positions failed; prefilling instead", n)
            return
        s.fed = n - len(held)
        self._feed_sampler(s, s.fed)

    def _turn_to_store(self, s: Request) -> None:
        """Stores the blocks of a session whose finished turn left its KV
        the base model's, unshifted."""
        conv = s.conv
        assert conv is not None
        st = conv.state
        if self.store is None or s.store_mark < 0 or not conv.store_ok:
            return
        if s.lora or st.loras or st.shifts or st.swapped is not None:
            return
        try:
            self.store.save(st.tokens, st.kv, (s.store_mark,))
        except Exception:
            log.exception("kv_store: storing a session's blocks failed")

    def _no_room(self, s: Request) -> bool:
        """A turn found no free pages: it waits while running sequences hold
        some (they finish or are swapped out by `_unjam`), and fails when
        nothing else does (its session keeps what it had)."""
        if any(q is not s and self._holds_pages(q) for q in self._running):
            return False
        self._finish(s, None, KvCacheFullError("the KV pool cannot hold this session turn"))
        return True

    def _start_turn(self, s: Request) -> None:
        """Resolves a turn against its session, as a synchronous engine's
        ``generate`` / ``chat`` would at this point: the sampler, the prompt
        (a chat keeps the common prefix), the grammar matcher, and the
        logits an empty prompt continues from."""
        conv, t = s.conv, s.turn
        assert conv is not None and t is not None
        st = conv.state
        s.turn = None
        self._metrics.session_turns += 1
        if t.sampler is not None:
            st.set_sampler(t.sampler)
        s.sampler = st.sampler
        s.seed = st.sampler_config.seed
        if t.chat is not None:
            toks = t.chat
            common = kept_prefix(st.tokens, toks)
            if common < st.n_past:
                st.truncate(common)
            prompt = toks[common:]
        elif t.text is not None:
            prompt = (
                self._tokenizer.encode(t.text, add_special=st.n_past == 0, parse_special=True)
                if t.text
                else []
            )
        else:
            prompt = list(t.tokens or [])
        if prompt:
            st.shift_for(len(prompt))
        check_fits(len(prompt), st.n_past, st.n_ctx)
        st.grammar, s.matcher = matcher_for(
            st.grammar, t.grammar, self._tokenizer, resume=not prompt
        )
        s.items = Items.of(t.grammar)
        if not prompt:
            logits = st.last_logits()
            if logits is not None:
                s.logits = logits
                s.t_prefilled = time.perf_counter()
            else:
                if not st.tokens:
                    raise GenerateError("empty prompt and empty context: nothing to continue from")
                # After a truncate the last position is evaluated again (the
                # sampler has seen it already).
                st.rewind_kv(st.n_past - 1)
                last = st.tokens.pop()
                prompt, s.seen = [last], 1
        s.prompt = prompt
        s.fed = 0

    def _end_turn(self, s: Request) -> None:
        """Hands a finished (or failed, or cancelled) turn's state back to
        its session: the tokens now in its KV, the next-token logits."""
        conv = s.conv
        assert conv is not None
        if s.handed_back:
            return
        s.handed_back = True
        st = conv.state
        if s.turn is None:
            new = (s.prompt[: s.fed] + s.generated)[s.absorbed :]
            st.tokens = (st.tokens + new)[: st.n_past]
            st.set_logits(s.logits if s.pending is None else None)
            if st.swapped is None:
                st.park()
        s.turn = None
        s.session = None
        s.logits = None
        conv.last_used = time.perf_counter()
        if conv.closed:
            self._drop(conv)
        conv.busy = False

    @staticmethod
    def _feed_sampler(s: Request, upto: int) -> None:
        """Shows the sampler the prompt up to ``upto``, once per token."""
        for tok in s.prompt[s.seen : upto]:
            s.sampler.accept(tok)
        s.seen = max(s.seen, upto)

    def _shifts(self, s: Request) -> bool:
        """Whether ``s`` shifts a full context (else it ends with "length")."""
        if s.conv is None:
            return self._shift is not None
        return s.conv.state.context_shift is not None

    def _shift_full(self, s: Request) -> None:
        """Shifts the full context of a decoding sequence that shifts one
        (a one-shot request without pages for the shift is preempted: it
        is recomputed, shifts and all, when pages are free)."""
        if s.spec_extra or not self._shifts(s):
            return  # drafts sit past the row being sampled: nothing is full
        if s.conv is not None:
            self._shift_turn(s)
        elif not self._shift_request(s):
            self._preempt(s)

    def _shift_request(self, s: Request) -> bool:
        """Shifts a one-shot request's full context as ``SessionState.
        shift_for`` shifts a session's, on the tokens its KV holds
        (``window``); nothing happens when nothing can be dropped (it ends
        with "length"). Pages it shares (a cached prefix, sibling choices)
        are copied first: False when even after evicting cache entries and
        idle sessions there is no page for that (nothing changed then)."""
        kv, policy = s.session, self._shift
        assert kv is not None and policy is not None
        done = s.replay[: s.fed] if s.replay is not None else s.prompt[: s.fed] + s.generated
        if s.window is None:
            s.window = []
        s.window.extend(done[s.absorbed :])
        s.absorbed = len(done)
        keep, discard = policy.plan_for(s.window, int(kv.n_past), self._tokenizer)
        if len(s.window) != kv.n_past or discard < 1:
            return True
        while True:
            try:
                kv.shift(keep, discard)
                break
            except KvCacheFullError:
                if not (self.prefix is not None and self.prefix.evict_one()):
                    if not self._hibernate_one():
                        return False
        del s.window[keep : keep + discard]
        return True

    def _shift_turn(self, s: Request) -> None:
        """A session turn that filled its context shifts it (see
        ``SessionState.shift_for``). The turn's evaluated tokens join the
        session's first, so the shift drops the right ones."""
        conv = s.conv
        assert conv is not None
        st = conv.state
        done = s.prompt[: s.fed] + s.generated
        if len(st.tokens) + len(done) - s.absorbed != st.n_past:
            return  # not a decoding step's bookkeeping: leave it to "length"
        st.tokens.extend(done[s.absorbed :])
        s.absorbed = len(done)
        st.shift_for(1)

    def _sample(self, s: Request) -> int | None:
        """The next token of a decoding sequence, or None when it ended."""
        assert s.logits is not None and s.session is not None
        m = s.matcher
        finish: FinishReason | None = None
        if s.session.n_past >= s.session.n_ctx and not s.stop_next:
            self._shift_full(s)
            if s.session is None:
                return None  # preempted for want of pages: it shifts when back
        spent = (
            len(s.generated) >= s.max_tokens or s.session.n_past - s.spec_extra >= s.session.n_ctx
        )
        if s.stop_next:
            finish = "stop"
        elif m is not None and (
            m.is_terminated() or (spent and s.items is not None and m.is_accepting())
        ):
            # The grammar is complete: nothing may follow, or (a run of
            # items) the tokens ran out exactly where one ended.
            finish = "stop"
        elif spent:
            finish = "length"
        if finish is None:
            if s.forcing and m is None:
                tok = s.forcing.pop(0)
            elif m is None:
                tok = int(s.sampler.sample(s.logits, None))
            elif s.grammar_budget:
                left = s.max_tokens - len(s.generated)
                if not self._shifts(s):
                    left = min(left, s.session.n_ctx - s.session.n_past)
                allowed = allowed_bytes(m, self._vocab)
                tok, by_budget = sample_within_budget(
                    s.sampler, m, s.logits, allowed, self._vocab, left, s.items
                )
                s.forced = s.forced or by_budget
            else:
                tok = int(s.sampler.sample(s.logits, allowed_bytes(m, self._vocab)))
                if not m.accept_token(tok):
                    raise GenerateError(f"internal error: sampled token {tok} the grammar refuses")
            if self._tokenizer.is_eog(tok) and (not s.ignore_eos or m is not None):
                s.sampler.accept(tok)
                finish = "eos"
            else:
                s.sampler.accept(tok)
                s.generated.append(tok)
                if s.logprobs is not None:
                    s.lps.append(token_logprob(s.logits, tok, s.logprobs, self._tokenizer))
                self._metrics.generated_tokens += 1
                if not s.t_first_token:
                    s.t_first_token = time.perf_counter()
                piece = s.text.push(self._tokenizer.token_to_piece(tok))
                if s.lazy is not None:
                    self._maybe_trigger(s)
                if s.cap is not None and not s.forcing:
                    s.forcing = list(s.cap.due(len(s.generated), s.text.text))
                if piece:
                    s.emit(s.piece(piece), None, None)
                if not s.text.stopped:
                    return tok
                if s.conv is None:
                    finish = "stop"
                else:
                    # A session keeps the token in its context, as a
                    # synchronous engine does: evaluated, then the end.
                    s.stop_next = True
                    return tok
        tail = s.text.finish()
        if tail:
            s.emit(s.piece(tail), None, None)
        if s.forced:
            finish = "length"  # complete, but only because the budget closed it
        now = time.perf_counter()
        done = Completion(
            text=s.text.text,
            tokens=s.generated,
            finish_reason=finish,
            timings=Timings(
                len(s.prompt),
                s.t_prefilled - s.t_arrive,
                len(s.generated),
                now - s.t_prefilled,
            ),
            seed=s.seed,
            logprobs=None if s.logprobs is None else tuple(s.lps),
        )
        if self._observers:
            self._observe(s, now, finish)
        self._finish(s, done, None)
        return None

    def add_observer(self, observer: Callable[[RequestTimes], None]) -> None:
        """Calls ``observer`` (on the worker thread: keep it short) with the
        times of every request that completes (finished or stopped, not
        failed or cancelled)."""
        self._observers.append(observer)

    def _observe(self, s: Request, now: float, finish: str) -> None:
        n = len(s.generated)
        first = s.t_first_token or now
        times = RequestTimes(
            queue_seconds=max(0.0, (s.t_started or s.t_arrive) - s.t_arrive),
            first_token_seconds=first - s.t_arrive if n else None,
            inter_token_seconds=(now - first) / (n - 1) if n > 1 else None,
            e2e_seconds=now - s.t_arrive,
            prompt_tokens=len(s.prompt),
            generated_tokens=n,
            finish_reason=finish,
        )
        for observe in self._observers:
            try:
                observe(times)
            except Exception:  # an observer's bug must not stop the worker
                log.exception("a request observer failed")

    def _maybe_trigger(self, s: Request) -> None:
        """Starts a lazy grammar once its trigger is in the output; the text
        after the trigger (in the same token) must already match it, or the
        output stays unconstrained (and the caller sees what was written)."""
        assert s.lazy is not None
        trigger, grammar = s.lazy
        full = s.text.text
        at = full.find(trigger, max(0, s.lazy_from - len(trigger) + 1))
        s.lazy_from = len(full)
        if at < 0:
            return
        s.lazy = None
        m = grammar.matcher(self._tokenizer)
        rest = full[at + len(trigger) :].encode()
        if rest and not m.accept_bytes(rest):
            return
        s.matcher = m

    def _finish(self, s: Request, done: Completion | None, err: BaseException | None) -> None:
        if done is not None and s.spec is not None and s.spec.draft.cache is not None:
            s.spec.draft.cache.add(s.prompt + s.generated)
        with self._cv:
            if s in self._running:
                self._running.remove(s)
            sh = s.share
            if sh is not None:
                if sh.leader is s and not sh.ready():
                    sh.failed = True  # the followers evaluate the prompt themselves
                elif s.follows():
                    sh.waiting -= 1
                    sh.drop_if_unwanted()
                # Request and share refer to each other: break the cycle so
                # a finished request (its sampler, matcher, buffers) is freed
                # at once, not at the next full garbage collection.
                if sh.leader is s:
                    sh.leader = None
                s.share = None
        if s.conv is not None:
            self._end_turn(s)
            if done is not None:
                self._turn_to_store(s)
        elif done is not None:
            self._to_store(s)
        with self._cv:
            s.session = None
            s.logits = None
            s.cancelled = True  # never scheduled again
        self._metrics.finished += 1
        s.emit(None, done, err)
