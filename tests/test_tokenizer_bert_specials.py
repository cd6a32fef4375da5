"""BERT (WordPiece) vocabularies whose BOS, EOS and separator share ids, with
``add_bos_token`` / ``add_eos_token`` / ``add_sep_token`` absent, true and
false, against llama.cpp (oxillama issue 33: a BERT whose EOS is its [SEP]
did not load).

The GGUFs are rebuilt here byte for byte by
tests/reference/make_bert_specials_reference.py, which recorded llama.cpp's
ids and flags for them in tests/reference/bert_specials.json. llama.cpp reads
the three flags (with WordPiece's defaults: BOS and separator on, EOS off)
but its WordPiece tokenizer does not consult them: with ``add_special`` it
always gives ``[BOS] text [SEP]``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from oxillama import _native
from oxillama.text.tokenizer import Tokenizer
from oxillama.text.tokenizer.gguf_vocab import GgufVocab
from oxillama.text.tokenizer.wordpiece import prenormalize
from tests.reference.make_bert_specials_reference import (
    FLAG_VALUES,
    FLAVOURS,
    MODE_KEYS,
    MODES,
    OUT,
    PATTERNS,
    TEXTS,
    Variant,
    files_sha256,
    gguf_bytes,
    variants,
)


@functools.cache
def _reference() -> dict[str, Any]:
    path = Path(OUT)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run tests/reference/make_bert_specials_reference.py")
    data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return data


def _records() -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in _reference()["variants"]}


def _ids(record: dict[str, Any]) -> dict[str, list[list[int]]]:
    """llama.cpp's ids of every text, by mode, for one file."""
    ids: dict[str, list[list[int]]] = _reference()["id_sets"][record["ids"]]
    return ids


def _metadata(v: Variant) -> dict[str, Any]:
    meta: dict[str, Any] = _native.GgufFile.from_bytes(gguf_bytes(v)).metadata()
    return meta


def test_reference_is_for_these_files() -> None:
    ref = _reference()
    assert (ref["texts"], ref["modes"]) == (TEXTS, MODE_KEYS)
    assert [r["name"] for r in ref["variants"]] == [v.name for v in variants()]
    assert files_sha256([gguf_bytes(v) for v in variants()]) == ref["files_sha256"]


def test_every_flag_value_meets_every_pattern_and_architecture() -> None:
    seen = {(v.pattern, v.add_bos, v.add_eos, v.add_sep) for v in variants()}
    assert len(seen) == len(PATTERNS) * len(FLAG_VALUES) ** 3
    for flag in ("add_bos", "add_eos", "add_sep"):
        pairs = {(v.pattern, v.flavour, getattr(v, flag)) for v in variants()}
        assert len(pairs) == len(PATTERNS) * len(FLAVOURS) * len(FLAG_VALUES), flag


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_vocabulary_reads_as_llama_cpp_reads_it(pattern: str) -> None:
    records = _records()
    bad = []
    for v in variants():
        if v.pattern != pattern:
            continue
        vocab = GgufVocab.from_metadata(_metadata(v))
        got = {
            "bos": vocab.bos_id,
            "eos": vocab.eos_id,
            "sep": vocab.sep_id,
            "add_bos": vocab.add_bos,
            "add_eos": vocab.add_eos,
            "add_sep": vocab.add_sep,
        }
        if got != records[v.name]["facts"]:
            bad.append((v.name, got, records[v.name]["facts"]))
    assert not bad, bad[:3]


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_token_ids_equal_llama_cpp(pattern: str) -> None:
    records = _records()
    bad = []
    checked = 0
    for v in variants():
        if v.pattern != pattern:
            continue
        tok = Tokenizer.from_gguf_metadata(_metadata(v))
        want = _ids(records[v.name])
        for key, (add, parse) in zip(MODE_KEYS, MODES, strict=True):
            for text, ids in zip(TEXTS, want[key], strict=True):
                got = tok.encode(text, add_special=add, parse_special=parse)
                checked += 1
                if got != ids:
                    bad.append((v.name, text, key, got, ids))
        # llama.cpp's add_special ends every WordPiece text with [SEP],
        # which embedding truncation must keep.
        assert tok.adds_closing_token
    assert not bad, f"{len(bad)}/{checked} differ, e.g. {bad[:3]}"
    assert checked == len(FLAG_VALUES) ** 3 * len(TEXTS) * len(MODES)


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_hf_post_processor_adds_what_llama_cpp_adds(pattern: str) -> None:
    """The HF tokenizer on its own (and a tokenizer.json saved from it)
    wraps the text as llama.cpp's add_special does, each shared special
    token in its every place."""
    records = _records()
    key = MODE_KEYS[MODES.index((True, True))]
    bad = []
    for v in variants():
        if v.pattern != pattern:
            continue
        hf = Tokenizer.from_gguf_metadata(_metadata(v)).hf
        for text, ids in zip(TEXTS, _ids(records[v.name])[key], strict=True):
            got = hf.encode(prenormalize(text)).ids
            if got != ids:
                bad.append((v.name, text, got, ids))
    assert not bad, bad[:3]
