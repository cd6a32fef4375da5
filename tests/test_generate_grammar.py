"""Constrained generation on the real SmolLM2: the output always parses, at
temperature 0 and sampled, EOS only where the grammar may end, "length" when
max_tokens cuts it, and a snapshot taken mid-grammar continues exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oxillama import Engine, SamplerConfig
from oxillama.decoding.grammar import Grammar
from oxillama.errors import GrammarError, ParameterError
from tests._gbnf_reference import accepts as reference_accepts

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws
ws     ::= | " " | "\n" [ \t]{0,8}
"""

ARITH = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]{1,3} | "(" expr ")"
"""

CHESS = r"""
root ::= move (" " move){0,3}
move ::= piece? file rank | "O-O" | "O-O-O"
piece ::= [KQRBN]
file ::= [a-h]
rank ::= [1-8]
"""

C_LIKE = r"""
root ::= stmt+
stmt ::= "int " ident " = " expr ";\n" | "return " expr ";\n"
ident ::= [a-z] [a-z0-9_]{0,7}
expr ::= ident | [0-9]{1,4} | ident " + " expr
"""

LIST = r"""
root ::= ("- " item "\n"){2,4}
item ::= [A-Za-z ]{1,20}
"""


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Engine:
    return Engine(model_path, context_size=512, threads=2)


@pytest.mark.parametrize(
    ("name", "source", "prompt"),
    [
        ("json", JSON_GBNF, "A JSON object describing a cat:"),
        ("arith", ARITH, "An arithmetic expression:"),
        ("chess", CHESS, "Opening moves in chess:"),
        ("c", C_LIKE, "A tiny C program:"),
        ("list", LIST, "A shopping list:"),
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_always_parses(
    engine: Engine, name: str, source: str, prompt: str, temperature: float
) -> None:
    g = Grammar(source)
    for seed in range(2 if temperature else 1):
        engine.reset()
        cfg = SamplerConfig(temperature=temperature, seed=seed)
        out = engine.generate(prompt, 48, grammar=g, sampler=cfg)
        if out.finish_reason == "length":
            # Cut short: still a valid prefix of the language.
            m = g.matcher(engine.tokenizer)
            assert m.accept_bytes(out.text.encode()), (name, out.text)
        else:
            assert out.finish_reason in ("eos", "stop")
            assert reference_accepts(source, out.text), (name, out.text)
            if name == "json":
                json.loads(out.text)


def test_eos_only_where_the_grammar_may_end(engine: Engine) -> None:
    # The model would love to stop early; the grammar demands a full stop.
    g = Grammar('root ::= [a-z ]{1,60} "."')
    for seed in range(4):
        engine.reset()
        out = engine.generate("Say hi:", 40, grammar=g, sampler=SamplerConfig(seed=seed))
        assert out.finish_reason in ("stop", "length")
        if out.finish_reason == "stop":
            assert re.fullmatch(r"[a-z ]{1,60}\.", out.text), out.text


def test_max_tokens_cut_reports_length(engine: Engine) -> None:
    engine.reset()
    out = engine.generate("Count:", 3, grammar='root ::= ("one " | "two ")+ "end"')
    assert out.finish_reason == "length" and len(out.tokens) == 3


def test_stream_and_chat_take_grammars(engine: Engine) -> None:
    g = Grammar('root ::= "yes" | "no"')
    engine.reset()
    text = "".join(engine.stream("Is ice cold? ", 8, grammar=g, sampler=SamplerConfig.greedy()))
    assert text in ("yes", "no")
    engine.reset()
    reply = engine.chat(
        [{"role": "user", "content": "Is fire hot?"}], 8, grammar=g, sampler=SamplerConfig.greedy()
    )
    assert reply.text in ("yes", "no") and reply.finish_reason in ("stop", "eos")


def test_bad_arguments_are_typed_errors(engine: Engine) -> None:
    with pytest.raises(GrammarError, match="undefined rule"):
        engine.generate("x", 4, grammar="root ::= nope")
    with pytest.raises(ParameterError, match="not both"):
        engine.generate("x", 4, grammar="root ::= [a]", json_schema={"type": "string"})
    with pytest.raises(ParameterError, match="GBNF text or a Grammar"):
        engine.generate("x", 4, grammar=42)  # type: ignore[arg-type]


def test_snapshot_mid_grammar_continues_exactly(engine: Engine) -> None:
    g = Grammar(JSON_GBNF)
    cfg = SamplerConfig(temperature=0.9, seed=11)
    engine.reset()
    whole = engine.generate("JSON for a dog:", 40, grammar=g, sampler=cfg, ignore_eos=True)
    engine.reset()
    first = engine.generate("JSON for a dog:", 12, grammar=g, sampler=cfg, ignore_eos=True)
    blob = engine.snapshot_bytes()
    restored = Engine.restore_bytes(blob)
    rest = restored.generate("", 28, grammar=g, ignore_eos=True)
    assert first.tokens + rest.tokens == whole.tokens[: len(first.tokens) + len(rest.tokens)]
    assert first.text + rest.text == whole.text
