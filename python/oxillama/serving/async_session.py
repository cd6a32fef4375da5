"""`AsyncSession`: a conversation that lives in the batching scheduler."""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from oxillama.decoding.completion import Completion
from oxillama.decoding.grammar import Grammar, constraint
from oxillama.decoding.logprobs import check_logprobs
from oxillama.decoding.reasoning import ReasoningCap, ReasoningFormat, ReplySplit
from oxillama.decoding.sampling import SamplerConfig
from oxillama.errors import GenerateError, ParameterError
from oxillama.serving.scheduler import Conversation, Emit, Request, Scheduler, Turn
from oxillama.serving.split_result import split_result

if TYPE_CHECKING:
    from oxillama.engine.engine import Engine, Message, Prompt
    from oxillama.model.model import Model

__all__ = ["AsyncSession"]


class SessionHost(Protocol):
    """What a session needs from the :class:`~oxillama.AsyncEngine` that
    holds it (so this module does not import that one)."""

    @property
    def engine(self) -> Engine: ...
    @property
    def model(self) -> Model: ...
    @property
    def scheduler(self) -> Scheduler: ...
    async def _complete(self, submit: Callable[[Emit], Request]) -> Completion: ...
    def _pieces(
        self, submit: Callable[[Emit], Request], result: list[Completion] | None
    ) -> AsyncGenerator[str, None]: ...


class AsyncSession:
    """A session of an :class:`~oxillama.AsyncEngine`: each call appends to
    its context, as calls on a synchronous :class:`~oxillama.Engine` do, and
    produces exactly the tokens that engine would.

    Its KV pages stay in the engine's shared pool between calls, so a turn
    only evaluates its new tokens; its turns are decoded in the same batched
    forward passes as every other request and prefilled in chunks like any
    prompt. While it waits, a session costs its pages (16 positions each)
    and the next-token state; under memory pressure the least recently used
    waiting session is hibernated (its KV copied out exactly) and comes back
    on its next call. Calls on one session run one after another.

    ``snapshot`` writes an ordinary OXISNAP1 file, which
    :meth:`Engine.restore <oxillama.Engine.restore>` and
    :meth:`AsyncEngine.restore_session <oxillama.AsyncEngine.restore_session>`
    both read. ``close()`` frees the pages at once (dropping the session
    does too, later).
    """

    def __init__(self, engine: SessionHost, conv: Conversation) -> None:
        self._engine = engine
        self._conv = conv
        self._lock = asyncio.Lock()
        # A session dropped without close() still gives its pages back.
        self._finalizer = weakref.finalize(self, engine.scheduler.close_session, conv)

    # ------------------------------------------------------------------ info

    @property
    def n_past(self) -> int:
        """Number of tokens in the context (after the last finished call)."""
        return self._conv.state.n_past

    @property
    def tokens(self) -> list[int]:
        """The session's token history (a copy)."""
        return list(self._conv.state.tokens)

    @property
    def n_ctx(self) -> int:
        return self._conv.state.n_ctx

    @property
    def sampler(self) -> SamplerConfig:
        return self._conv.state.sampler_config

    @property
    def hibernated(self) -> bool:
        """Whether its KV is out of the pool (it returns on the next call)."""
        return self._conv.state.swapped is not None

    @property
    def closed(self) -> bool:
        return self._conv.closed

    def _kv_bytes(self, page_bytes: int) -> int:
        """Bytes of KV cache the session holds: its pages of the pool
        (``page_bytes`` each), or, while its KV is copied out of the pool
        (hibernated under pressure, or restored and not woken yet), that
        copy; none once closed. Only on the scheduler's worker
        (``Scheduler.call``): anywhere else the native session may be in a
        forward pass, and a session in a turn is counted as it stands
        between two steps."""
        if self._conv.closed:
            return 0
        state = self._conv.state
        if state.swapped is not None:
            return len(state.swapped[1])
        return int(state.kv.pages_held) * page_bytes

    # ------------------------------------------------------------ generation

    def _turn(
        self,
        prompt: Prompt | None,
        chat: list[int] | None,
        sampler: SamplerConfig | None,
        grammar: str | Grammar | None,
        json_schema: Mapping[str, Any] | Any | None,
        logprobs: int | None = None,
    ) -> Turn:
        if sampler is not None and not isinstance(sampler, SamplerConfig):
            raise TypeError(f"sampler must be a SamplerConfig, not {type(sampler).__name__}")
        if sampler is not None:
            sampler.validate(self._engine.model.vocab_size)
        turn = Turn(
            sampler=sampler,
            grammar=constraint(grammar, json_schema),
            chat=chat,
            logprobs=check_logprobs(logprobs),
        )
        if isinstance(prompt, str):
            turn.text = prompt
        elif prompt is not None:
            turn.tokens = self._engine.engine._check_tokens(prompt)
        return turn

    def _submit(
        self,
        turn: Turn,
        max_tokens: int,
        stop: Sequence[str],
        ignore_eos: bool,
        trigger: str | None = None,
        cap: ReasoningCap | None = None,
    ) -> Any:
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ParameterError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        stops = [stop] if isinstance(stop, str) else list(stop)
        lazy = None
        if trigger is not None:
            if not isinstance(trigger, str) or not trigger:
                raise ParameterError("grammar_trigger must be a non-empty string")
            if turn.grammar is None:
                raise ParameterError("grammar_trigger needs a grammar or json_schema")
            # The grammar waits for its trigger instead of applying at once.
            lazy, turn.grammar = (trigger, turn.grammar), None
        sched = self._engine.scheduler
        return lambda emit: sched.submit_turn(
            self._conv,
            turn,
            max_tokens,
            stop=stops,
            ignore_eos=ignore_eos,
            emit=emit,
            logprobs=turn.logprobs,
            lazy=lazy,
            cap=cap,
        )

    async def generate(
        self,
        prompt: Prompt = "",
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        logprobs: int | None = None,
    ) -> Completion:
        """Appends ``prompt`` (text or token ids; empty continues from the
        current position) and generates up to ``max_tokens`` tokens, with
        the meaning of :meth:`Engine.generate <oxillama.Engine.generate>`."""
        turn = self._turn(prompt, None, sampler, grammar, json_schema, logprobs)
        submit = self._submit(turn, max_tokens, stop, ignore_eos)
        async with self._lock:
            self._check_open()
            return await self._engine._complete(submit)

    def stream(
        self,
        prompt: Prompt = "",
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        result: list[Completion] | None = None,
        logprobs: int | None = None,
    ) -> AsyncGenerator[str, None]:
        """Like :meth:`generate`, yielding text pieces as they come; leaving
        early stops the turn (what was generated stays in the context).
        Nothing is checked or queued until the first piece is awaited."""
        return self._pieces(
            lambda: self._turn(prompt, None, sampler, grammar, json_schema, logprobs),
            max_tokens,
            stop,
            ignore_eos,
            result,
        )

    async def _pieces(
        self,
        make_turn: Callable[[], Turn],
        max_tokens: int,
        stop: Sequence[str],
        ignore_eos: bool,
        result: list[Completion] | None,
        trigger: str | None = None,
        cap: ReasoningCap | None = None,
    ) -> AsyncGenerator[str, None]:
        submit = self._submit(make_turn(), max_tokens, stop, ignore_eos, trigger, cap)
        async with self._lock:
            self._check_open()
            pieces = self._engine._pieces(submit, result)
            try:
                async for piece in pieces:
                    yield piece
            finally:
                # Leaving early cancels the turn now, not when the inner
                # generator is collected.
                await pieces.aclose()

    def _chat_prompt(
        self,
        messages: Sequence[Message],
        kwargs: dict[str, Any],
        reasoning_format: ReasoningFormat,
        reasoning_budget: int | None = None,
    ) -> tuple[list[int], ReplySplit, ReasoningCap | None]:
        """The rendered chat's tokens, how the reply to it comes apart and
        the cap on its reasoning."""
        eng = self._engine.engine
        text = eng.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
        split = eng._reply_split(text, reasoning_format)
        cap = eng._reasoning_cap(text, reasoning_budget)
        return eng.tokenize(text, add_special=True, parse_special=True), split, cap

    async def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int = 256,
        *,
        sampler: SamplerConfig | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        grammar: str | Grammar | None = None,
        json_schema: Mapping[str, Any] | Any | None = None,
        logprobs: int | None = None,
        grammar_trigger: str | None = None,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int | None = None,
        **template_kwargs: Any,
    ) -> Completion:
        """Replies to a conversation; only the part of the rendered chat that
        differs from the session's context is evaluated, and the reply comes
        apart into ``text``, ``reasoning`` and ``tool_calls``, as in
        :meth:`Engine.chat <oxillama.Engine.chat>`. With
        ``grammar_trigger``, ``grammar`` / ``json_schema`` apply only from
        the first occurrence of that text in the reply on (a tool call the
        model may or may not make). ``reasoning_budget`` caps the tokens of
        a ``<think>`` reasoning (see
        :class:`~oxillama.decoding.reasoning.ReasoningCap`)."""
        tokens, split, cap = self._chat_prompt(
            messages, template_kwargs, reasoning_format, reasoning_budget
        )
        turn = self._turn(None, tokens, sampler, grammar, json_schema, logprobs)
        submit = self._submit(turn, max_tokens, stop, ignore_eos, grammar_trigger, cap)
        async with self._lock:
            self._check_open()
            done = await self._engine._complete(submit)
        return split.apply(done)

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
        logprobs: int | None = None,
        grammar_trigger: str | None = None,
        reasoning_format: ReasoningFormat = "auto",
        reasoning_budget: int | None = None,
        **template_kwargs: Any,
    ) -> AsyncGenerator[str, None]:
        """Streaming form of :meth:`chat`: the reply's text pieces as the
        model writes them (markers and channels included); ``result``, when
        given, receives the :class:`Completion` that :meth:`chat` returns,
        split the same way."""

        def start(whole: list[Completion]) -> tuple[ReplySplit, AsyncGenerator[str, None]]:
            tokens, split, cap = self._chat_prompt(
                messages, template_kwargs, reasoning_format, reasoning_budget
            )
            pieces = self._pieces(
                lambda: self._turn(None, tokens, sampler, grammar, json_schema, logprobs),
                max_tokens,
                stop,
                ignore_eos,
                whole,
                grammar_trigger,
                cap,
            )
            return split, pieces

        return split_result(start, result)

    async def truncate(self, n: int) -> bool:
        """Keeps the first ``n`` tokens of the context and forgets the rest
        (as :meth:`Engine.truncate <oxillama.Engine.truncate>`), between
        turns, on the scheduler's worker. Returns False, keeping everything,
        when the session's KV is out of the pool (hibernated under memory
        pressure): it cannot be cut there."""
        state = self._conv.state
        async with self._lock:
            self._check_open()
            if not 0 <= n <= self.n_past:
                raise ParameterError(f"truncate: n must be between 0 and {self.n_past}, got {n}")

            def cut() -> bool:
                if state.swapped is not None:
                    return False
                state.truncate(n)
                return True

            fut = self._engine.scheduler.call(cut)
            return bool(await asyncio.wrap_future(fut))

    # ------------------------------------------------------------- snapshots

    async def fork(self) -> AsyncSession:
        """A new session of the same engine that continues exactly as this
        one would (tokens, next-token logits, sampler and grammar state,
        adapters), its KV pages shared with this one copy on write: the
        fork costs no KV memory until one of the two writes a shared page.
        Taken between turns; each then continues independently and
        snapshots on its own."""
        state = self._conv.state
        async with self._lock:
            self._check_open()
            fut = self._engine.scheduler.call(state.fork)
            twin = await asyncio.wrap_future(fut)
        return AsyncSession(self._engine, self._engine.scheduler.open_session(twin))

    async def snapshot_bytes(self) -> bytes:
        """The session as OXISNAP1 bytes (taken between turns)."""
        from oxillama.sessions.session import capture_bytes

        state = self._conv.state
        async with self._lock:
            self._check_open()
            fut = self._engine.scheduler.call(lambda: capture_bytes(state))
            return await asyncio.wrap_future(fut)

    async def snapshot(self, path: str | os.PathLike[str], *, durable: bool = True) -> None:
        """Writes the session to ``path`` as OXISNAP1, atomically (see
        :meth:`Engine.snapshot <oxillama.Engine.snapshot>`). The state is
        copied between two scheduler steps; the file is written off both
        the worker and the event loop."""
        from oxillama.sessions.atomic import write_bytes

        blob = await self.snapshot_bytes()
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: write_bytes(path, blob, durable=durable)
        )

    # ------------------------------------------------------------------ end

    async def close(self) -> None:
        """Frees the session's pages; later calls raise ``GenerateError``."""
        self._finalizer()

    def _check_open(self) -> None:
        if self._conv.closed:
            raise GenerateError("this session is closed")

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("hibernated" if self.hibernated else "live")
        return f"AsyncSession(n_past={self.n_past}, n_ctx={self.n_ctx}, {state})"
