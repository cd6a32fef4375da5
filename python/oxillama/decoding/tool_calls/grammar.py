"""The grammar that makes a reply one tool call (or several, in
parallel), each naming an offered function and carrying arguments valid
against its JSON Schema, in the model's call syntax."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from oxillama.decoding.grammar import Grammar
from oxillama.decoding.grammar.json_schema import schema_to_gbnf
from oxillama.decoding.tool_calls.detector import Custom, ToolFormat
from oxillama.errors import ParameterError

__all__ = ["call_grammar", "lazy_call_grammar"]


def _rename_root(gbnf: str, new: str) -> str:
    """``gbnf`` with the rule ``root`` renamed ``new`` wherever it is a rule
    name (never inside a literal or a character class)."""
    out: list[str] = []
    i, n = 0, len(gbnf)
    while i < n:
        ch = gbnf[i]
        if ch in '"[':
            end_ch = '"' if ch == '"' else "]"
            j = i + 1
            while j < n and gbnf[j] != end_ch:
                j += 2 if gbnf[j] == "\\" else 1
            out.append(gbnf[i : j + 1])
            i = j + 1
        elif ch.isalnum() or ch == "-":
            j = i
            while j < n and (gbnf[j].isalnum() or gbnf[j] == "-"):
                j += 1
            word = gbnf[i:j]
            out.append(new if word == "root" else word)
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _lit(s: str) -> str:
    return json.dumps(s)  # a GBNF literal escapes like a JSON string


def _variants_rules(fns: Sequence[Mapping[str, Any]]) -> str:
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in fns
    ]
    return _rename_root(schema_to_gbnf({"anyOf": variants}), "call")


def lazy_call_grammar(tools: Sequence[Mapping[str, Any]], fmt: ToolFormat) -> tuple[str, Grammar]:
    """For a reply that may be text or a call: the marker that opens a call
    in ``fmt``, and the grammar of what follows it (the call, valid against
    its function's schema, then the closing marker), to apply lazily."""
    body = _variants_rules([t.get("function", t) for t in tools])
    pad = "[ \\n]*"
    if isinstance(fmt, Custom):
        return fmt.open, Grammar(f"root ::= {pad} call {pad} {_lit(fmt.close)}\n{body}")
    if fmt == "qwen":
        close = _lit("</tool_call>")
        return "<tool_call>", Grammar(f"root ::= {pad} call {pad} {close}\n{body}")
    if fmt == "mistral":
        return "[TOOL_CALLS]", Grammar(f'root ::= {pad} "[" call ("," ws call)* "]"\n{body}')
    if fmt == "llama3":
        return "<|python_tag|>", Grammar(f"root ::= {pad} call\n{body}")
    raise ParameterError(f"unknown tool-call format {fmt!r}")


def call_grammar(
    tools: Sequence[Mapping[str, Any]],
    fmt: ToolFormat,
    *,
    only: str | None = None,
    parallel: bool = True,
) -> Grammar:
    """A grammar for calls to ``tools`` (or to the function ``only``), in
    ``fmt``; several calls when ``parallel``, each after the first begun
    only when the token budget can finish it (``Grammar.item_end``)."""
    fns = [t.get("function", t) for t in tools]
    if only is not None:
        fns = [f for f in fns if f.get("name") == only]
        if not fns:
            raise ParameterError(f"tool_choice names '{only}', which is not among the tools")
    body = _variants_rules(fns)
    if isinstance(fmt, Custom):
        one = f"{_lit(fmt.open)} call {_lit(fmt.close)}"
    elif fmt == "qwen":
        one = f'{_lit("<tool_call>")} "\\n" call "\\n" {_lit("</tool_call>")}'
    elif fmt == "mistral":
        # One array holds every call.
        many = ' ("," ws call)*' if parallel else ""
        return Grammar(
            f'root ::= {_lit("[TOOL_CALLS]")} "[" call{many} "]"\n{body}',
            # After a call only the closing `]` is missing.
            item_end=1 if parallel else None,
        )
    elif fmt == "llama3":
        # Llama 3.1/3.2's JSON calls come one per reply.
        return Grammar(f"root ::= call\n{body}")
    else:
        raise ParameterError(f"unknown tool-call format {fmt!r}")
    if not parallel:
        return Grammar(f"root ::= {one}\n{body}")
    return Grammar(f'root ::= {one} ("\\n" {one})*\n{body}', item_end=0)
