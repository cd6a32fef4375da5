"""The tokenizer built from GGUF metadata against llama.cpp, on two real
models: SmolLM2-135M (byte-level BPE, pre-tokenizer "smollm") and Gemma-3-270M
(SentencePiece "llama" model, 262k pieces, byte fallback).

Reference ids come from tests/reference/make_reference.py (llama.cpp through
llama-cpp-python). Metadata is read with llama.cpp's own ``gguf`` package
(tests/_gguf_meta.py), independently of our Rust reader. Neither model is
ever skipped: a missing package fails with the pip command that installs it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxillama import _native
from oxillama.errors import LoadError
from oxillama.text.tokenizer import Tokenizer
from oxillama.text.tokenizer.bpe import (
    UNICODE_TO_BYTE,
    bpe_piece,
    bpe_pieces,
    check_merges,
    split_merges,
)
from oxillama.text.tokenizer.gguf_vocab import _TYPE_ATTR, _type_attrs
from oxillama.text.tokenizer.pretokenizers import PRETOKENIZERS, pretokenizer
from oxillama.text.tokenizer.tokenizer import _gguf_piece, _gguf_pieces
from tests._gguf_meta import ModelMissing, gemma3_path, read_metadata, smollm2_path
from tests.reference.corpus import TOKEN_TEXTS

REF = Path(__file__).parent / "reference"
MODELS = ("smollm2", "gemma3")


def _records(model: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((REF / f"tokens_{model}.json").read_text("utf-8"))
    return data


def _vocab_facts(model: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REF / f"vocab_{model}.json").read_text("utf-8"))
    return data


CASES = [(m, i, r) for m in MODELS for i, r in enumerate(_records(m))]


def _case_id(case: tuple[str, int, dict[str, Any]]) -> str:
    m, i, r = case
    flags = ("B" if r["add_special"] else "") + ("S" if r["parse_special"] else "")
    return f"{m}-{i}-{flags}-{r['text'][:16]!r}"


# ------------------------------------------------------------------ fixtures


def _path(model: str) -> Path:
    try:
        return smollm2_path() if model == "smollm2" else gemma3_path()
    except ModelMissing as e:  # fail, never skip
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def model_paths() -> dict[str, Path]:
    """Both GGUF files; Gemma-3's is assembled by its package's assemble()."""
    return {m: _path(m) for m in MODELS}


@pytest.fixture(scope="session")
def metadata(model_paths: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {m: read_metadata(p) for m, p in model_paths.items()}


@pytest.fixture(scope="session")
def tokenizers(metadata: dict[str, dict[str, Any]]) -> dict[str, Tokenizer]:
    return {m: Tokenizer.from_gguf_metadata(meta) for m, meta in metadata.items()}


# ------------------------------------------------------- ids equal llama.cpp


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_token_ids_equal_llama_cpp(
    tokenizers: dict[str, Tokenizer], case: tuple[str, int, dict[str, Any]]
) -> None:
    model, _, r = case
    got = tokenizers[model].encode(
        r["text"], add_special=r["add_special"], parse_special=r["parse_special"]
    )
    assert got == r["ids"]


def test_corpus_is_large_and_varied() -> None:
    for model in MODELS:
        records = _records(model)
        texts = {r["text"] for r in records}
        assert len(texts) >= 30
        assert {(r["add_special"], r["parse_special"]) for r in records} == {
            (a, p) for a in (False, True) for p in (False, True)
        }
    joined = "".join(TOKEN_TEXTS)
    for needle in ("", " ", "\t", "\n", "1234567890", "日本語", "مرحبا", "नमस्ते", "\u200d"):
        assert needle in TOKEN_TEXTS or needle in joined
    assert any("<|im_start|>" in t for t in TOKEN_TEXTS)
    assert any("<start_of_turn>" in t for t in TOKEN_TEXTS)


@pytest.mark.parametrize("model", MODELS)
def test_vocabulary_facts_equal_llama_cpp(tokenizers: dict[str, Tokenizer], model: str) -> None:
    tok, ref = tokenizers[model], _vocab_facts(model)
    assert tok.vocab_size == ref["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (ref["bos"], ref["eos"], ref["eot"])
    assert (tok.add_bos, tok.add_eos) == (ref["add_bos"], ref["add_eos"])
    assert sorted(tok.eog_ids) == ref["eog"]
    assert [i for i in range(tok.vocab_size) if tok.is_eog(i)] == ref["eog"]
    control = [i for i in range(tok.vocab_size) if tok.is_special(i)]
    assert len(control) == ref["n_control"]
    assert hashlib.sha256(",".join(map(str, control)).encode()).hexdigest() == ref["control_sha256"]
    h = hashlib.sha256()
    for i in range(tok.vocab_size):
        p = tok.token_to_piece(i)
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    assert h.hexdigest() == ref["pieces_sha256"], "token_to_piece differs from llama.cpp"


def test_end_of_generation_tokens(tokenizers: dict[str, Tokenizer]) -> None:
    smol, gemma = tokenizers["smollm2"], tokenizers["gemma3"]
    # <|endoftext|>, <|im_end|> (EOS) and <reponame> (a FIM repo marker).
    assert sorted(smol.eog_ids) == [0, 2, 4]
    assert not smol.is_eog(1)  # <|im_start|>
    assert gemma.is_eog(gemma.encode("<end_of_turn>")[0]) and gemma.is_eog(1)
    assert not gemma.is_eog(gemma.encode("<start_of_turn>")[0])


def test_metadata_equals_our_rust_reader(
    model_paths: dict[str, Path], metadata: dict[str, dict[str, Any]]
) -> None:
    """The engine builds its tokenizer from the Rust reader's dict; it must
    be the dict the gguf package reads."""
    for model, path in model_paths.items():
        ours = _native.GgufFile.open(str(path)).metadata()
        ref = metadata[model]
        keys = [k for k in ref if k.startswith("tokenizer.")]
        assert keys and {k: ours.get(k) for k in keys} == {k: ref[k] for k in keys}


# --------------------------------------------------------- special tokens


def test_special_token_parsing_on_and_off(tokenizers: dict[str, Tokenizer]) -> None:
    smol, gemma = tokenizers["smollm2"], tokenizers["gemma3"]
    text = "<|im_start|>user\nHi<|im_end|>"
    on = smol.encode(text)
    off = smol.encode(text, parse_special=False)
    assert on[0] == 1 and on[-1] == 2
    assert 1 not in off and 2 not in off and len(off) > len(on)
    assert smol.decode(on) == smol.decode(off) == text
    assert gemma.encode("<start_of_turn>") == [105]
    assert len(gemma.encode("<start_of_turn>", parse_special=False)) > 1
    # User-defined tokens (Gemma's HTML tags, whitespace runs) stay whole
    # even as plain text, as in llama.cpp.
    for user_defined in ("<b>", "\t\t", "    "):
        assert len(gemma.encode(user_defined, parse_special=False)) == 1


def test_add_special_follows_the_model(tokenizers: dict[str, Tokenizer]) -> None:
    smol, gemma = tokenizers["smollm2"], tokenizers["gemma3"]
    assert smol.encode("Hi", add_special=True) == smol.encode("Hi")  # add_bos false
    assert gemma.encode("Hi", add_special=True) == [2, *gemma.encode("Hi")]
    assert gemma.encode("", add_special=True) == [2] and gemma.encode("") == []


# ------------------------------------------------------------ round trips


@pytest.mark.parametrize("model", MODELS)
def test_detokenization_round_trips(tokenizers: dict[str, Tokenizer], model: str) -> None:
    tok = tokenizers[model]
    for text in TOKEN_TEXTS:
        for parse_special in (True, False):
            ids = tok.encode(text, parse_special=parse_special)
            assert tok.decode(ids) == text
            # Streaming: the pieces' bytes concatenate to the UTF-8 text.
            assert b"".join(tok.token_to_piece(i) for i in ids) == text.encode()
        ids = tok.encode(text, add_special=True, parse_special=False)
        assert tok.decode(ids, skip_special=True) == text


def test_skip_special_drops_control_tokens(tokenizers: dict[str, Tokenizer]) -> None:
    smol = tokenizers["smollm2"]
    ids = smol.encode("<|im_start|>assistant\nOK<|im_end|>")
    assert smol.decode(ids, skip_special=True) == "assistant\nOK"
    gemma = tokenizers["gemma3"]
    ids = gemma.encode("Hi <b>there</b>", add_special=True)
    assert gemma.decode(ids) == "<bos>Hi <b>there</b>"
    assert gemma.decode(ids, skip_special=True) == "Hi <b>there</b>"  # user-defined kept


def test_pieces_are_raw_bytes(tokenizers: dict[str, Tokenizer]) -> None:
    smol, gemma = tokenizers["smollm2"], tokenizers["gemma3"]
    # A rare emoji becomes byte pieces that are not valid UTF-8 on their own.
    for tok in (smol, gemma):
        ids = tok.encode("\U0001fae8")  # a rare emoji: byte pieces
        pieces = [tok.token_to_piece(i) for i in ids]
        assert b"".join(pieces) == "\U0001fae8".encode()
    assert gemma.token_to_piece(gemma.encode(" the")[0]) == b" the"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol.token_to_piece(smol.vocab_size)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol.decode([-1])


_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581"), max_size=40
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=_TEXT, parse_special=st.booleans())
def test_random_text_round_trips(
    tokenizers: dict[str, Tokenizer], text: str, parse_special: bool
) -> None:
    for tok in tokenizers.values():
        ids = tok.encode(text, parse_special=parse_special)
        assert all(0 <= i < tok.vocab_size for i in ids)
        # SmolLM2 has no token for 21 byte values (0x04, 0xF1, ...): llama.cpp
        # drops those bytes, and so do we.
        missing = _missing_bytes(tok)
        kept = bytes(b for b in text.encode() if b not in missing)
        assert tok.decode(ids).encode() == kept or (missing and "\ufffd" in tok.decode(ids))


_MISSING: dict[int, frozenset[int]] = {}


def _missing_bytes(tok: Tokenizer) -> frozenset[int]:
    if id(tok) not in _MISSING:
        single = {tok.token_to_piece(i) for i in range(tok.vocab_size)}
        _MISSING[id(tok)] = frozenset(b for b in range(256) if bytes([b]) not in single)
    return _MISSING[id(tok)]


def test_bytes_without_tokens_are_dropped(tokenizers: dict[str, Tokenizer]) -> None:
    smol = tokenizers["smollm2"]
    assert {0x04, 0x1D, 0xF1, 0xF5} <= _missing_bytes(smol)
    assert not _missing_bytes(tokenizers["gemma3"])  # <0xXX> byte fallback
    # The dropped character still separates what is around it.
    assert smol.encode(">\x04,") == smol.encode(">") + smol.encode(",")
    assert smol.encode(">,") != smol.encode(">") + smol.encode(",")


# ------------------------------------------------------------ construction


def _tiny_bpe(pre: str, **extra: Any) -> dict[str, Any]:
    from oxillama.text.tokenizer.bpe import BYTE_TO_UNICODE

    tokens = ["<|endoftext|>", *BYTE_TO_UNICODE.values(), "he", "ll", "hell", "hello", "Ġw"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "hell o", "Ġ w"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
        **extra,
    }


def test_pretokenizer_table() -> None:
    for name in ("smollm", "default", "gpt2", "gpt-2", "llama3", "llama-bpe", "qwen2"):
        assert name in PRETOKENIZERS
    assert "deepseek-llm" in PRETOKENIZERS and "deepseek-coder" in PRETOKENIZERS
    assert pretokenizer("llama-bpe").ignore_merges and pretokenizer("llama3").add_bos
    with pytest.raises(LoadError, match="'no-such-pre'"):
        pretokenizer("no-such-pre")
    with pytest.raises(LoadError, match="unsupported pre-tokenizer 'no-such-pre'"):
        Tokenizer.from_gguf_metadata(_tiny_bpe("no-such-pre"))
    # Every regex in the table compiles and splits text.
    for name in sorted(PRETOKENIZERS):
        tok = Tokenizer.from_gguf_metadata(_tiny_bpe(name))
        text = "hello world 12345 it's <x> \u65e5\u672c \t\n"
        assert tok.decode(tok.encode(text)) == text, name


def test_pretokenizers_split_as_llama_cpp_does() -> None:
    def pieces(pre: str, text: str) -> list[bytes]:
        tok = Tokenizer.from_gguf_metadata(_tiny_bpe(pre))
        return [tok.token_to_piece(i) for i in tok.encode(text)]

    # Digits one at a time (smollm) vs. in threes (llama3) vs. GPT-2 runs.
    assert pieces("smollm", "12345") == [b"1", b"2", b"3", b"4", b"5"]
    assert pieces("gpt2", "12345") == [b"1", b"2", b"3", b"4", b"5"]  # no merges
    assert pieces("llama3", "hello") == [b"hello"]  # ignore_merges: whole token
    assert pieces("smollm", "hello world") == [b"hello", b" w", b"o", b"r", b"l", b"d"]
    # llama3 defaults add_bos to true; the GGUF key wins.
    assert Tokenizer.from_gguf_metadata(_tiny_bpe("llama3")).add_bos
    off = _tiny_bpe("llama3", **{"tokenizer.ggml.add_bos_token": False})
    assert not Tokenizer.from_gguf_metadata(off).add_bos


def _tiny_spm(**extra: Any) -> dict[str, Any]:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    normal = {"\u2581": -1.0, "a": -2.0, "b": -3.0, "\u2581a": -1.5, "ab": -0.5, "\u2581ab": -0.2}
    tokens = pieces + list(normal)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(pieces) + list(normal.values()),
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(normal),
        **extra,
    }


def test_sentencepiece_space_prefix_scores_and_byte_fallback() -> None:
    tok = Tokenizer.from_gguf_metadata(_tiny_spm())
    ids = {p: i for i, p in enumerate(_tiny_spm()["tokenizer.ggml.tokens"])}
    # Defaults for "llama": BOS 1 / EOS 2, add_bos and add_space_prefix on.
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, True)
    assert tok.encode("ab") == [ids["\u2581ab"]]  # best-scoring merges first
    assert tok.encode("ab", add_special=True) == [1, ids["\u2581ab"]]
    # "x" has no piece: its UTF-8 bytes; "é" is two byte tokens.
    assert tok.encode("ax") == [ids["\u2581a"], ids["<0x78>"]]
    assert tok.encode("\u00e9") == [ids["\u2581"], ids["<0xC3>"], ids["<0xA9>"]]
    assert tok.decode(tok.encode("ab ax \u00e9")) == "ab ax \u00e9"
    assert tok.decode(tok.encode("ab", add_special=True), skip_special=True) == "ab"
    assert tok.decode(tok.encode("ab", add_special=True)) == "<s>ab"
    for text in (" ab", "ab  a", "<s> a</s>b", "</s>", "  "):
        assert tok.decode(tok.encode(text)) == text
    # A space is prefixed after each special token too, as llama.cpp does.
    assert tok.encode("a</s>a") == [ids["\u2581a"], 2, ids["\u2581a"]]
    no_prefix = Tokenizer.from_gguf_metadata(
        _tiny_spm(**{"tokenizer.ggml.add_space_prefix": False})
    )
    assert no_prefix.encode("ab") == [ids["ab"]]
    assert is_unk_special(tok)


def is_unk_special(tok: Tokenizer) -> bool:
    """Unknown-type tokens are parsed like control tokens."""
    return tok.encode("<unk>") == [0] and 0 not in tok.encode("<unk>", parse_special=False)


def test_missing_or_unsupported_vocabulary_raises_load_error() -> None:
    with pytest.raises(LoadError, match=r"tokenizer\.ggml\.model is missing"):
        Tokenizer.from_gguf_metadata({})
    with pytest.raises(LoadError, match="unsupported tokenizer model 't5'"):
        Tokenizer.from_gguf_metadata({**_tiny_bpe("gpt2"), "tokenizer.ggml.model": "t5"})
    no_merges = {k: v for k, v in _tiny_bpe("gpt2").items() if k != "tokenizer.ggml.merges"}
    with pytest.raises(LoadError, match="merges"):
        Tokenizer.from_gguf_metadata(no_merges)
    with pytest.raises(LoadError, match="scores"):
        Tokenizer.from_gguf_metadata(
            {k: v for k, v in _tiny_spm().items() if k != "tokenizer.ggml.scores"}
        )
    dup = _tiny_bpe("gpt2")
    dup["tokenizer.ggml.tokens"] = [*dup["tokenizer.ggml.tokens"][:-1], "he"]
    with pytest.raises(LoadError, match="duplicate token"):
        Tokenizer.from_gguf_metadata(dup)


# ------------------------------------------------------- tokenizer.json


def test_tokenizer_json_overrides(
    tokenizers: dict[str, Tokenizer], metadata: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    for model in MODELS:
        tok, meta = tokenizers[model], metadata[model]
        path = tmp_path / f"{model}.json"
        path.write_text(tok.hf.to_str(), encoding="utf-8")
        with_meta = Tokenizer.from_file(path, meta)
        bare = Tokenizer.from_file(path)
        assert (with_meta.bos_id, with_meta.eos_id) == (tok.bos_id, tok.eos_id)
        # Without metadata, BOS/EOS are guessed from the usual token texts.
        assert bare.eos_id is not None and bare.is_eog(bare.eos_id)
        for t in (with_meta, bare):
            assert t.vocab_size == tok.vocab_size
            for r in _records(model)[::5]:
                assert t.encode(r["text"], parse_special=r["parse_special"]) == tok.encode(
                    r["text"], parse_special=r["parse_special"]
                )
        assert with_meta.eog_ids == tok.eog_ids
        # BOS is added as the model adds it, with or without metadata (the
        # saved tokenizer.json carries a post-processor for it).
        for t in (with_meta, bare):
            assert t.add_bos == tok.add_bos
            assert t.encode("Hi", add_special=True) == tok.encode("Hi", add_special=True)
        assert tok.hf.encode("Hi").ids == tok.encode("Hi", add_special=True)
        assert all(with_meta.token_to_piece(i) == tok.token_to_piece(i) for i in range(300))
    with pytest.raises(LoadError, match="cannot load tokenizer"):
        Tokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LoadError, match="cannot load tokenizer"):
        Tokenizer.from_file(tmp_path / "bad.json")


def test_metadata_mapping_is_only_read(metadata: dict[str, dict[str, Any]]) -> None:
    meta: Mapping[str, Any] = metadata["smollm2"]
    before = len(meta["tokenizer.ggml.tokens"])
    Tokenizer.from_gguf_metadata(meta)
    assert len(meta["tokenizer.ggml.tokens"]) == before


# GGUF strings are UTF-8: no lone surrogates.
_GPT2_AND_MORE = st.sampled_from(sorted(UNICODE_TO_BYTE)) | st.characters(exclude_categories=["Cs"])


@settings(max_examples=2000, deadline=None)
@given(st.text(_GPT2_AND_MORE, max_size=8))
def test_bpe_piece_fast_path_equals_the_character_loop(token: str) -> None:
    """``bpe_piece`` translates a whole token at once; characters outside
    GPT-2's table (kept as UTF-8) must come out as the plain loop gives."""
    want = b"".join(
        bytes([UNICODE_TO_BYTE[c]]) if c in UNICODE_TO_BYTE else c.encode() for c in token
    )
    assert bpe_piece(token) == want


@settings(max_examples=500, deadline=None)
@given(st.lists(st.text(_GPT2_AND_MORE, max_size=6), max_size=12))
def test_bpe_pieces_of_a_vocabulary_equal_each_token_alone(tokens: list[str]) -> None:
    assert bpe_pieces(tokens) == [bpe_piece(t) for t in tokens]


_ATTR_BITS = st.sampled_from([0, 1, 2, 4, 8, 16, 32, 4 | 8, 32 | 4, 16 | 256, 2 | 8])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(_GPT2_AND_MORE, max_size=6), _ATTR_BITS), max_size=12))
def test_native_pieces_equal_the_per_token_rule(items: list[tuple[str, int]]) -> None:
    """The whole-vocabulary native pass gives each token's bytes exactly as
    ``_gguf_piece`` does token by token (byte tokens are handed back)."""
    tokens = [t for t, _ in items]
    attrs = [a for _, a in items]
    assert _gguf_pieces(tokens, attrs, "bpe") == [
        _gguf_piece(t, a, "bpe") for t, a in zip(tokens, attrs, strict=True)
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("ab \u0120\u00e9", min_size=2, max_size=5), max_size=10))
def test_merges_split_the_same_with_or_without_the_vocabulary(rules: list[str]) -> None:
    rules = [r for r in rules if " " in r[1:]]
    tokens = sorted({p for r in rules for p in split_merges([r])[0]} | {"zz"})[::2]
    with_vocab = split_merges(rules, tokens)
    assert with_vocab == split_merges(rules)
    for a, b in with_vocab:
        # A part that is a token is the vocabulary's own string object.
        for part in (a, b):
            if part in tokens:
                assert part is tokens[tokens.index(part)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=4), st.integers(), st.floats(allow_nan=False))))
def test_native_str_list_is_list_map_str(items: list[object]) -> None:
    got = _native.str_list(items)
    assert got == list(map(str, items))
    assert all(g is i for g, i in zip(got, items, strict=True) if type(i) is str)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 12), st.integers(), st.booleans(), st.floats(0, 9))))
def test_native_token_types_give_the_same_attributes(types: list[Any]) -> None:
    want = list(map(_TYPE_ATTR.get, map(int, types), itertools.repeat(0)))
    assert _type_attrs(types, len(types)) == want
    assert _type_attrs(types, len(types) // 2) == want[: len(types) // 2]


def test_merges_read_from_the_file_split_as_from_its_metadata() -> None:
    try:
        path = smollm2_path()
    except ModelMissing as e:
        pytest.fail(str(e))
    f = _native.GgufFile.open(str(path))
    meta = f.metadata()
    tokens = meta["tokenizer.ggml.tokens"]
    got = _native.split_file_merges(f, tokens)
    assert got is not None and got[1] == -1
    assert got[0] == split_merges(meta["tokenizer.ggml.merges"], tokens)


def test_damaged_merges_name_the_merge() -> None:
    with pytest.raises(LoadError, match="merge #1 'ab' is not two"):
        split_merges(["a b", "ab"])
    vocab = {"a": 0, "b": 1, "ab": 2}
    check_merges([("a", "b")], vocab)
    with pytest.raises(LoadError, match="merge #1 'b a': its result 'ba'"):
        check_merges([("a", "b"), ("b", "a")], vocab)
