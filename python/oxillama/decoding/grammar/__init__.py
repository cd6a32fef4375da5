"""Grammars: GBNF and JSON Schema.

>>> from oxillama import Engine, Grammar
>>> g = Grammar('root ::= "yes" | "no"')
>>> Engine().generate("Is water wet? Answer: ", 4, grammar=g).text in ("yes", "no")
True

A :class:`Grammar` is parsed and checked once (errors carry line and
column) and can be reused by any number of generations and engines; the
pushdown matcher that runs it lives in the Rust extension.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import oxillama._native as _native
from oxillama.decoding.grammar import gbnf
from oxillama.decoding.grammar.compile import Compiled, compile_gbnf, compile_rules

# Imported here, not on first use: the module defines dataclasses, whose
# generated methods cost ~20 ms to build, and that belongs to importing
# oxillama, not to the first schema a server compiles.
from oxillama.errors import GrammarError, ParameterError

if TYPE_CHECKING:
    from oxillama.text.tokenizer import Tokenizer

__all__ = ["Grammar", "GrammarError", "allowed_bytes", "constraint", "vocab_trie"]


#: Grammars of recently compiled schemas, by canonical JSON (LRU).
_SCHEMA_CACHE_SIZE = 128
_SCHEMA_GRAMMARS: collections.OrderedDict[str, Grammar] = collections.OrderedDict()
_SCHEMA_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Compiling allocates thousands of short-lived, acyclic objects; a
    cyclic collection landing in the middle (it scans every object of the
    process) took as long as the compile itself (measured 4-5 ms of 11)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Grammar:
    """A checked GBNF grammar (llama.cpp's dialect); ``root`` names the start
    rule.

    ``item_end`` marks a grammar that is a run of items, such as parallel
    tool calls: the most bytes that finish it right after an item (0 where
    it may end there, 1 before a closing ``]``). Under the token budget
    another item is then begun only when the tokens left cover the longest
    item so far (see :mod:`oxillama.decoding.grammar.budget`)."""

    def __init__(self, source: str, *, root: str = "root", item_end: int | None = None) -> None:
        if not isinstance(root, str) or not root:
            raise GrammarError(f"root must be a rule name, got {root!r}")
        if item_end is not None and (
            isinstance(item_end, bool) or not isinstance(item_end, int) or item_end < 0
        ):
            raise ParameterError(f"item_end must be a non-negative integer, got {item_end!r}")
        with _no_gc():
            compiled = compile_gbnf(source, root)
        self._setup(compiled, source, root, item_end)

    @classmethod
    def _from_rules(cls, source: str, rules: list[gbnf.Rule]) -> Grammar:
        """A grammar whose ``source`` was generated together with its parsed
        ``rules`` (so it is not parsed again)."""
        self = cls.__new__(cls)
        self._setup(compile_rules(rules, "root"), source, "root")
        return self

    def _setup(
        self, compiled: Compiled, source: str, root: str, item_end: int | None = None
    ) -> None:
        self._compiled: Compiled = compiled
        self._source = source
        self._root = root
        self._item_end = item_end
        self._programs: weakref.WeakKeyDictionary[Tokenizer, _native.GrammarProgram] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, Any] | Any, *, strict: bool = True) -> Grammar:
        """The grammar of JSON documents valid against ``schema`` (a dict, or
        a pydantic model: anything with ``model_json_schema()``). With
        ``strict=False`` unsupported keywords warn and are ignored instead of
        raising :class:`~oxillama.errors.JsonSchemaError`.

        The same schema (up to key order) returns the same Grammar, so
        requests that repeat a ``response_format`` share one compile and
        its warm mask caches."""
        # The schema compiler loads with its first schema: most programs
        # never use it, and its tables take a third of the package's import.
        from oxillama.decoding.grammar.json_schema import as_schema, schema_to_rules

        schema = as_schema(schema)
        try:
            key: str | None = json.dumps(schema, sort_keys=True) + ("" if strict else "~lax")
        except (TypeError, ValueError, RecursionError):
            key = None  # not JSON (the compiler reports why)
        if key is not None:
            with _SCHEMA_LOCK:
                hit = _SCHEMA_GRAMMARS.get(key)
                if hit is not None:
                    _SCHEMA_GRAMMARS.move_to_end(key)
                    return hit
        with _no_gc():
            source, rules = schema_to_rules(schema, strict=strict)
            grammar = cls._from_rules(source, rules)
        if key is not None:
            with _SCHEMA_LOCK:
                _SCHEMA_GRAMMARS[key] = grammar
                while len(_SCHEMA_GRAMMARS) > _SCHEMA_CACHE_SIZE:
                    _SCHEMA_GRAMMARS.popitem(last=False)
        return grammar

    @property
    def source(self) -> str:
        return self._source

    @property
    def root(self) -> str:
        return self._root

    @property
    def item_end(self) -> int | None:
        return self._item_end

    @property
    def n_rules(self) -> int:
        """Rules after lowering (groups and repetitions become rules)."""
        return len(self._compiled.rules)

    def _program(self, tokenizer: Tokenizer) -> _native.GrammarProgram:
        """The program for one vocabulary (``<token>`` references resolved)."""
        prog = self._programs.get(tokenizer)
        if prog is None:
            ids = _token_ids(tokenizer, self._compiled.token_texts)
            prog = _native.GrammarProgram(self._compiled.program(ids.__getitem__))
            self._programs[tokenizer] = prog
        return prog

    def matcher(self, tokenizer: Tokenizer) -> _native.GrammarMatcher:
        """A fresh matcher over ``tokenizer``'s vocabulary."""
        return _native.GrammarMatcher(self._program(tokenizer), vocab_trie(tokenizer))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Grammar)
            and other._source == self._source
            and other._root == self._root
        )

    def __hash__(self) -> int:
        return hash((self._source, self._root))

    def __repr__(self) -> str:
        first = self._source.strip().splitlines()[0] if self._source.strip() else ""
        return f"Grammar({first[:60]!r}{'...' if len(first) > 60 else ''}, root={self._root!r})"


def _token_ids(tokenizer: Tokenizer, texts: frozenset[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    if not texts:
        return out
    wanted = {t.encode(): t for t in texts}
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.token_to_piece(i)
        text = wanted.get(piece)
        # The first match wins, control tokens before text tokens.
        if text is not None and (text not in out or tokenizer.is_special(i)):
            if text in out and tokenizer.is_special(out[text]):
                continue
            out[text] = i
    missing = sorted(texts - out.keys())
    if missing:
        raise GrammarError(
            "token reference(s) not in the vocabulary: " + ", ".join(f"<{t}>" for t in missing)
        )
    return out


def vocab_trie(tokenizer: Tokenizer) -> _native.VocabTrie:
    """The vocabulary's byte trie, built once per tokenizer and shared."""
    trie = _TRIES.get(tokenizer)
    if trie is None:
        n = tokenizer.vocab_size
        pieces = [tokenizer.token_to_piece(i) for i in range(n)]
        special = [tokenizer.is_special(i) for i in range(n)]
        trie = _native.VocabTrie(pieces, special, sorted(tokenizer.eog_ids))
        _TRIES[tokenizer] = trie
    return trie


_TRIES: weakref.WeakKeyDictionary[Tokenizer, _native.VocabTrie] = weakref.WeakKeyDictionary()


def allowed_bytes(matcher: _native.GrammarMatcher, vocab_size: int) -> bytes:
    """The matcher's mask as ``Sampler.sample`` takes it, padded to the
    model's vocabulary (which may be larger than the tokenizer's)."""
    allowed = matcher.mask()
    need = (vocab_size + 7) // 8
    return allowed if len(allowed) >= need else allowed.ljust(need, b"\0")


def constraint(grammar: str | Grammar | None, json_schema: Any) -> Grammar | None:
    """The grammar a call's ``grammar`` (GBNF text or a :class:`Grammar`) or
    ``json_schema`` asks for, compiled; None when it asks for none."""
    if grammar is not None and json_schema is not None:
        raise ParameterError("pass grammar or json_schema, not both")
    if isinstance(grammar, Grammar) or grammar is None:
        return grammar if json_schema is None else Grammar.from_json_schema(json_schema)
    if isinstance(grammar, str):
        return Grammar(grammar)
    raise ParameterError(f"grammar must be GBNF text or a Grammar, not {type(grammar).__name__}")
