"""Real vocabularies: llama.cpp's own ``models/ggml-vocab-*.gguf`` (fetched by
scripts/fetch_vocabs.py), tokenized by oxillama and by llama.cpp.

For each vocabulary whose tokenizer model and pre-tokenizer we claim, the
ids of every corpus text (``corpus.TOKEN_TEXTS``, the families' chat markup
``corpus.FAMILY_MARKUP`` and ``corpus.UNICODE_SPACES``, with ``add_special``
and ``parse_special`` on and off) equal llama.cpp's, recorded by
tests/reference/make_vocab_reference.py in tests/reference/vocabs/. The ids
llama.cpp ships beside each vocabulary (``.inp``/``.out``, made with HF
tokenizers) are a second check. Vocabularies we do not build must stay a
``LoadError`` naming what is missing.

The files are not committed (5-16 MB each); a missing one fails, naming
the script that fetches it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pytest

from oxillama.errors import LoadError
from oxillama.text.tokenizer import Tokenizer
from oxillama.text.tokenizer.bpe import UNICODE_TO_BYTE
from oxillama.text.tokenizer.gguf_vocab import _DETECT, A_NORMAL, GgufVocab
from oxillama.text.tokenizer.pretokenizers import PRETOKENIZERS
from tests._vocab_files import FETCH, reference, vocab_bytes, vocab_metadata
from tests.reference.corpus import FAMILY_MARKUP, TOKEN_TEXTS, UNICODE_SPACES

TEXTS = [*TOKEN_TEXTS, *FAMILY_MARKUP, *UNICODE_SPACES]

SUPPORTED = (
    "aquila",
    "baichuan",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "gpt-neox",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
)
#: WordPiece vocabularies: ids, facts and pieces are checked like the
#: others; the round trips are not, since BERT's normalization is lossy by
#: design (lower case, accents and spacing around punctuation dropped).
WORDPIECE = ("bert-bge",)
#: Tokenizer models we do not build, with the name the error must give.
UNSUPPORTED = {"nomic-bert-moe": "'t5'"}
SPM = ("baichuan", "llama-spm", "phi-3")
#: Vocabularies whose llama.cpp detokenizer drops the space before ``?!.,``
#: (its clean_spaces, on for these pre-tokenizers; we keep the text as is).
CLEANS_SPACES = (
    *("aquila", "falcon", "gemma-4", "gpt-2", "gpt-neox"),
    *("llama-bpe", "mpt", "refact", "starcoder"),
)


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(vocab_metadata(name))


def test_every_fetched_vocabulary_is_tested() -> None:
    assert set(SUPPORTED) | set(WORDPIECE) | set(UNSUPPORTED) == set(FETCH.VOCABS)
    assert not set(SUPPORTED) & set(UNSUPPORTED)
    assert not set(WORDPIECE) & (set(SUPPORTED) | set(UNSUPPORTED))
    for name in FETCH.VOCABS:
        records = reference(name).get("records", [])
        assert [r["text"] for r in records[::4]] == TEXTS, f"rerun make_vocab_reference.py ({name})"


def test_real_vocabularies_cover_our_pre_tokenizers() -> None:
    """Every distinct set of regexes in our table is run on a real
    vocabulary here, except the ones listed (no vocabulary-only GGUF of
    llama.cpp uses them); SmolLM2's "smollm" is in test_tokenizer.py."""
    covered = set()
    for name in SUPPORTED:
        pre = GgufVocab.from_metadata(vocab_metadata(name))
        if pre.kind == "bpe":
            covered.add(pre.pre_tokenizer.regexes)
    uncovered = {n for n, p in PRETOKENIZERS.items() if p.regexes not in covered and n != "smollm"}
    not_in_llama_cpp_vocabs = {
        *("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
        *("poro-chat", "bloom", "gpt3-finnish", "viking", "tekken"),
    }
    assert uncovered == not_in_llama_cpp_vocabs


# ---------------------------------------------------------- ids as llama.cpp


@pytest.mark.parametrize("name", SUPPORTED + WORDPIECE)
def test_token_ids_equal_llama_cpp(name: str) -> None:
    tok = _tokenizer(name)
    records = reference(name)["records"]
    bad = []
    for r in records:
        got = tok.encode(r["text"], add_special=r["add_special"], parse_special=r["parse_special"])
        if got != r["ids"]:
            bad.append((r["text"], r["add_special"], r["parse_special"], got, r["ids"]))
    assert not bad, f"{len(bad)}/{len(records)} differ, e.g. {bad[:3]}"
    assert len(records) == 4 * len(TEXTS)


#: llama.cpp ships no .inp/.out beside these.
NO_EXPECTED_IDS = ("aquila", "baichuan", "gpt-neox")


@pytest.mark.parametrize("name", [n for n in SUPPORTED if n not in NO_EXPECTED_IDS])
def test_ids_llama_cpp_ships_with_the_vocabulary(name: str) -> None:
    """llama.cpp's test-tokenizer-0 inputs and HF tokenizers' ids for them
    (plain text: no BOS, control-token text not parsed)."""
    vocab_bytes(name)  # fails with the fetch command when missing
    inp = Path(f"{FETCH.vocab_path(name)}.inp")
    out = Path(f"{FETCH.vocab_path(name)}.out")
    texts = inp.read_text("utf-8").split("\n__ggml_vocab_test__\n")
    wants = [[int(t) for t in line.split()] for line in out.read_text("utf-8").split("\n")]
    assert len(texts) >= 40 and len(wants) >= len(texts)
    tok = _tokenizer(name)
    bad = [
        (t, got, want)
        for t, want in zip(texts, wants, strict=False)
        if (got := tok.encode(t, parse_special=False)) != want
    ]
    assert not bad, bad[:3]


# ------------------------------------------------------------- vocabulary


def _eot_candidates(name: str) -> list[int]:
    tok = _tokenizer(name)
    ids = {tok.hf.id_to_token(i): i for i in range(tok.vocab_size)}
    return sorted(ids[t] for t in _DETECT["eot"] if t in ids)


@pytest.mark.parametrize("name", SUPPORTED + WORDPIECE)
def test_vocabulary_facts_equal_llama_cpp(name: str) -> None:
    tok, ref = _tokenizer(name), reference(name)["facts"]
    assert tok.vocab_size == ref["n_vocab"]
    assert (tok.bos_id, tok.eos_id) == (ref["bos"], ref["eos"])
    assert (tok.add_bos, tok.add_eos) == (ref["add_bos"], ref["add_eos"])
    assert sorted(tok.eog_ids) == ref["eog"]
    control = [i for i in range(tok.vocab_size) if tok.is_special(i)]
    assert len(control) == ref["n_control"]
    assert hashlib.sha256(",".join(map(str, control)).encode()).hexdigest() == ref["control_sha256"]
    # Without an eot_token_id key, llama.cpp takes the first end-of-turn text
    # its std::unordered_map yields: with several candidates that order is
    # the C++ library's hash order (it differs between libstdc++ and libc++).
    # We take the lowest id; both are end-of-generation tokens.
    candidates = _eot_candidates(name)
    if "tokenizer.ggml.eot_token_id" in vocab_metadata(name) or len(candidates) < 2:
        assert tok.eot_id == ref["eot"]
    else:
        assert tok.eot_id == candidates[0] and ref["eot"] in candidates
        assert tok.is_eog(ref["eot"])


def _llama_cpp_piece(token: str) -> bytes:
    """llama.cpp's text for a byte-level BPE token holding characters outside
    GPT-2's byte alphabet: each such character becomes a marker that repeats
    the whole token."""
    out = bytearray()
    for c in token:
        b = UNICODE_TO_BYTE.get(c)
        if b is None:
            out += b"[UNK_BYTE_0x" + c.encode().hex().encode() + token.encode() + b"]"
        else:
            out.append(b)
    return bytes(out)


@pytest.mark.parametrize("name", SUPPORTED + WORDPIECE)
def test_token_pieces_equal_llama_cpp(name: str) -> None:
    """Streamed text is these bytes. Only command-r has tokens whose text is
    outside GPT-2's byte alphabet (no tokenization produces them); for those
    we give their UTF-8, as HF tokenizers does, where llama.cpp writes a
    ``[UNK_BYTE_0x…]`` marker."""
    tok, ref = _tokenizer(name), reference(name)["facts"]
    v = GgufVocab.from_metadata(vocab_metadata(name))
    h = hashlib.sha256()
    outside = 0
    for i in range(tok.vocab_size):
        p = tok.token_to_piece(i)
        text = v.tokens[i]
        if v.kind == "bpe" and v.has(i, A_NORMAL) and any(c not in UNICODE_TO_BYTE for c in text):
            assert p == text.encode()
            p = _llama_cpp_piece(text)
            outside += 1
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    assert h.hexdigest() == ref["pieces_sha256"]
    assert (outside > 0) == (name == "command-r")


# ----------------------------------------------------------- decoding


@pytest.mark.parametrize("name", SUPPORTED)
def test_decode_round_trips_and_differs_from_llama_cpp_only_by_spaces(name: str) -> None:
    """Our decode gives the corpus text back. llama.cpp's llama_detokenize
    does not always: SentencePiece vocabularies keep the space added after
    BOS and control tokens; the CLEANS_SPACES vocabularies drop a space
    before ``?!.,``. Everything else is equal. (The families' markup does
    not always round trip, in llama.cpp either: Phi-3 drops whitespace after
    its special tokens, SentencePiece reads a ``▁`` in the text as a space,
    falcon has no token for the byte 0x0B.)"""
    tok = _tokenizer(name)
    equal = 0
    for r in reference(name)["records"]:
        ids, text = r["ids"], r["text"]
        ours, plain = tok.decode(ids), tok.decode(ids, skip_special=True)
        corpus = text in TOKEN_TEXTS
        if corpus and not r["parse_special"]:
            assert plain == text
        elif corpus and not r["add_special"]:
            assert ours == text
        for mine, theirs in ((ours, r["detok"]), (plain, r["detok_plain"])):
            if mine == theirs:
                equal += 1
                continue
            assert mine.replace(" ", "") == theirs.replace(" ", ""), (text, mine, theirs)
            if name in SPM:
                assert len(theirs) > len(mine)
            else:
                assert name in CLEANS_SPACES and len(theirs) < len(mine)
    assert equal >= len(TEXTS)


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_token_round_trips(name: str) -> None:
    """llama.cpp's test-tokenizer-1 property: each token's text, tokenized
    again (special tokens parsed), decodes to the same text; with
    ignore_merges, it is that one token again."""
    tok = _tokenizer(name)
    v = GgufVocab.from_metadata(vocab_metadata(name))
    whole = v.kind == "bpe" and v.pre_tokenizer.ignore_merges
    bad = []
    for i in range(tok.vocab_size):
        try:
            text = tok.token_to_piece(i).decode("utf-8")
        except UnicodeDecodeError:
            continue  # a byte token or part of a character
        ids = tok.encode(text)
        if tok.decode(ids) != text or (whole and len(ids) > 1):
            bad.append((i, text, ids))
    assert not bad, bad[:5]


# Every 16th code point outside the surrogates and the unassigned planes.
CODE_POINTS = [
    c for c in range(0, 0x110000, 16) if not (0xD800 <= c <= 0xDFFF or 0x40000 <= c <= 0xE0000)
]


@pytest.mark.parametrize("name", SUPPORTED)
def test_code_points_round_trip(name: str) -> None:
    tok = _tokenizer(name)
    bad = [c for c in CODE_POINTS if tok.decode(tok.encode(chr(c))) != chr(c)]
    assert not bad, [hex(c) for c in bad[:10]]


# ------------------------------------------------------------- refusals


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_tokenizer_models_are_load_errors(name: str) -> None:
    with pytest.raises(LoadError, match=f"unsupported tokenizer model {UNSUPPORTED[name]}"):
        Tokenizer.from_gguf_metadata(vocab_metadata(name))
    assert "error" not in reference(name)  # llama.cpp itself loads them


def test_unknown_pre_tokenizer_on_a_real_vocabulary_is_a_load_error() -> None:
    meta = {**vocab_metadata("qwen2"), "tokenizer.ggml.pre": "qwen-next-year"}
    with pytest.raises(LoadError, match="unsupported pre-tokenizer 'qwen-next-year'"):
        Tokenizer.from_gguf_metadata(meta)
