"""A damaged GGUF vocabulary is a LoadError naming the problem, whatever
the damage (never the tokenizers library's bare Exception), and text that
is not Unicode (a lone UTF-16 surrogate) is a TokenizeError naming its
position: Engine.tokenize rejects it rather than replacing it silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import Engine, TokenizeError, _native
from oxillama.errors import LoadError, OxiLlamaError
from oxillama.text.tokenizer import Tokenizer
from oxillama.text.tokenizer.bpe import BYTE_TO_UNICODE
from tests._gguf_builder import ARRAY, GGUF, I32, STRING, U32


def _bpe_meta() -> dict[str, Any]:
    tokens = ["<|endoftext|>", *BYTE_TO_UNICODE.values(), "he", "ll", "hell", "hello", "Ġw"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "hell o", "Ġ w"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }


def _spm_meta() -> dict[str, Any]:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    normal = {"\u2581": -1.0, "a": -2.0, "b": -3.0, "\u2581a": -1.5, "ab": -0.5}
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": pieces + list(normal),
        "tokenizer.ggml.scores": [0.0] * len(pieces) + list(normal.values()),
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(normal),
    }


def _write(path: Path, meta: dict[str, Any]) -> Path:
    kvs: list[tuple[str, int, Any]] = [("general.architecture", STRING, "llama")]
    for key, value in meta.items():
        if key.endswith(("tokens", "merges")):
            kvs.append((key, ARRAY, (STRING, value)))
        elif key.endswith("token_type"):
            kvs.append((key, ARRAY, (I32, value)))
        elif isinstance(value, str):
            kvs.append((key, STRING, value))
        elif isinstance(value, int):
            kvs.append((key, U32, value))
    path.write_bytes(GGUF(kvs=kvs).build())
    return path


def _from_file(path: Path) -> Tokenizer:
    """Through the real reader, as a model load does."""
    return Tokenizer.from_gguf_metadata(dict(_native.GgufFile.open(str(path)).metadata()))


def test_a_gguf_whose_merges_no_longer_match_its_vocabulary_is_a_load_error(
    tmp_path: Path,
) -> None:
    good = _bpe_meta()
    hello = good["tokenizer.ggml.tokens"].index("hello")
    assert _from_file(_write(tmp_path / "good.gguf", good)).encode("hello") == [hello]
    # A token the merges need is gone (renamed, as by a flipped byte).
    damaged = dict(good)
    damaged["tokenizer.ggml.tokens"] = [
        "hexl" if t == "hell" else t for t in good["tokenizer.ggml.tokens"]
    ]
    with pytest.raises(LoadError, match=r"merge #2 'he ll': its result 'hell' is not in"):
        _from_file(_write(tmp_path / "bad-result.gguf", damaged))
    damaged["tokenizer.ggml.merges"] = ["h e", "zz q"]
    damaged["tokenizer.ggml.tokens"] = good["tokenizer.ggml.tokens"]
    with pytest.raises(LoadError, match=r"merge #1 'zz q': its first part 'zz'"):
        _from_file(_write(tmp_path / "bad-part.gguf", damaged))


def test_engine_tokenize_rejects_a_lone_surrogate_naming_its_position(engine: Engine) -> None:
    for text, at in (("\ud800", 0), ("ok \udfff!", 3), ("é😀\udbff", 2)):
        with pytest.raises(TokenizeError, match=f"position {at}") as info:
            engine.tokenize(text)
        assert info.value.position == at
        assert isinstance(info.value, (OxiLlamaError, ValueError))
    # A proper pair (one astral character) is fine.
    assert engine.detokenize(engine.tokenize("a😀")) == "a😀"


def test_every_tokenizer_kind_rejects_surrogates() -> None:
    for meta in (_bpe_meta(), _spm_meta()):
        tok = Tokenizer.from_gguf_metadata(meta)
        with pytest.raises(TokenizeError):
            tok.encode("a\ud83d", parse_special=False)


# --------------------------------------------------------- mutated metadata


@st.composite
def damaged(draw: st.DrawFn) -> dict[str, Any]:
    meta = draw(st.sampled_from([_bpe_meta, _spm_meta]))()
    keys = sorted(meta)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(keys))
        value = meta[key]
        if isinstance(value, list) and value:
            i = draw(st.integers(0, len(value) - 1))
            op = draw(st.sampled_from(["drop", "dup", "replace", "truncate", "extend"]))
            value = list(value)
            if op == "drop":
                del value[i]
            elif op == "dup":
                value.insert(i, value[i])
            elif op == "truncate":
                value = value[:i]
            elif op == "extend":
                value += value[: draw(st.integers(1, 3))]
            else:
                value[i] = draw(
                    st.one_of(
                        st.text(max_size=6),
                        st.integers(-(2**31), 2**31 - 1),
                        st.floats(allow_nan=True),
                        st.none(),
                    )
                )
            meta[key] = value
        else:
            meta[key] = draw(
                st.one_of(st.integers(-5, 400), st.text(max_size=8), st.none(), st.booleans())
            )
    return meta


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(meta=damaged(), text=st.text(max_size=20))
def test_mutated_vocabularies_build_or_raise_load_error(meta: dict[str, Any], text: str) -> None:
    try:
        tok = Tokenizer.from_gguf_metadata(meta)
    except LoadError as e:
        assert str(e)
        return
    # What builds must tokenize: ids in range, or a typed error.
    try:
        ids = tok.encode(text)
    except TokenizeError:
        return
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert isinstance(tok.decode(ids), str)
