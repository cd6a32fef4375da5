"""Small BERT-style WordPiece GGUFs whose BOS, EOS and separator share ids in
every way they can, with ``add_bos_token``, ``add_eos_token`` and
``add_sep_token`` each absent, true and false (oxillama issue 33: a BERT
whose EOS is its [SEP] did not load), tokenized by llama.cpp.

    pip install llama-cpp-python==0.3.36      # builds llama.cpp (~10 min)
    python tests/reference/make_bert_specials_reference.py

writes ``bert_specials.json`` next to this file. The GGUFs are not committed:
``variants()`` and ``gguf_bytes()`` rebuild them byte for byte (the test,
tests/test_tokenizer_bert_specials.py, does).

The files are laid out as llama.cpp's converter (``conversion/bert.py``,
``BertModel.set_vocab``, which nomic-bert and jina-bert-v2 with a
BertTokenizer share) writes them: ``tokenizer.ggml.model = "bert"``, the
vocabulary in its phantom-space form (``▁word``, bare continuations, control
tokens as they are), CONTROL for the tokenizer's added special tokens and
NORMAL for the rest (``[unusedN]`` included), the token type count, the
special ids as unsigned 32-bit keys and the ``add_*`` flags as booleans. The
architecture (bert, nomic-bert, jina-bert-v2) and the pre-tokenizer name
rotate over the variants. There are no tensors: ``Llama(path,
vocab_only=True)`` reads nothing past the metadata.

For each file the JSON has llama.cpp's BOS, EOS and separator ids, its
add_bos/add_eos/add_sep flags, and ``Llama.tokenize``'s ids of every text of
``TEXTS`` with ``add_special`` and ``parse_special`` on and off: an index
into ``id_sets``, which holds each distinct set of ids once (llama.cpp's
depend on the sharing pattern only, none of the flags). ``files_sha256``
hashes the files, so the test knows it rebuilt the ones llama.cpp read.
Deterministic: re-running on the same build rewrites the same file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUT = HERE / "bert_specials.json"
sys.path.insert(0, str(HERE.parent.parent))

from tests._gguf_builder import ARRAY, BOOL, F32, GGUF, I32, STRING, U32  # noqa: E402

# Token types (gguf.TokenType).
NORMAL, CONTROL = 1, 3

#: BERT's own layout of the first ids (bert-base-uncased's vocab.txt), which
#: llama.cpp's defaults for a bert vocabulary assume.
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
_WORDS = "hello world the run un token bert embed naive mega is an of to and in".split()
_CONTINUATIONS = "##ning ##aff ##able ##izer ##ding ##ed ##ly".split()


def _bert_vocab() -> list[tuple[str, int]]:
    """(token as BERT writes it, type): a WordPiece vocabulary of a few
    hundred tokens in BERT's order, then one extra control token, ``[END]``,
    for the variants whose EOS is none of BERT's own specials."""
    head = [("[PAD]", CONTROL)] + [(f"[unused{i}]", NORMAL) for i in range(99)]
    head += [(t, CONTROL) for t in ("[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    body = [*"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", *"0123456789", *map(chr, range(97, 123))]
    body += [f"##{c}" for c in [*"0123456789", *map(chr, range(97, 123))]]
    body += [*_WORDS, *_CONTINUATIONS]
    return head + [(t, NORMAL) for t in body] + [("[END]", CONTROL)]


def _phantom(token: str, kind: int) -> str:
    """The converter's phantom-space form of a BERT token."""
    if kind == CONTROL:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


VOCAB = [(_phantom(t, k), k) for t, k in _bert_vocab()]
TOKENS = [t for t, _ in VOCAB]
END = TOKENS.index("[END]")

#: (BOS, EOS, separator) of each way they can share ids.
PATTERNS: dict[str, tuple[int, int, int]] = {
    "distinct": (CLS, END, SEP),
    "eos=sep": (CLS, SEP, SEP),
    "bos=eos": (CLS, CLS, SEP),
    "bos=sep": (CLS, END, CLS),
    "all-equal": (SEP, SEP, SEP),
}
#: A flag's three states: key absent, true, false.
FLAG_VALUES: tuple[bool | None, ...] = (None, True, False)
#: (architecture, tokenizer.ggml.pre, type_vocab_size) of the converters
#: that write a WordPiece vocabulary.
FLAVOURS = (
    ("bert", "bert-bge", 2),
    ("nomic-bert", "default", 2),
    ("jina-bert-v2", "jina-v2-en", 2),
)

TEXTS = [
    "Hello world",
    "unaffable running, tokenizers!",
    "",
    "hello [SEP] world [CLS] [END] [MASK] [UNK]",
    "Naïve \u03a9mega 42",
]


@dataclass(frozen=True)
class Variant:
    pattern: str
    add_bos: bool | None
    add_eos: bool | None
    add_sep: bool | None
    flavour: int

    @property
    def name(self) -> str:
        def show(v: bool | None) -> str:
            return "absent" if v is None else str(v).lower()

        return (
            f"{self.pattern}/{FLAVOURS[self.flavour][0]}/add_bos={show(self.add_bos)},"
            f"add_eos={show(self.add_eos)},add_sep={show(self.add_sep)}"
        )


def variants() -> list[Variant]:
    """Every sharing pattern with every combination of the three flags (135
    files). The architecture rotates with the sum of the indices, so each
    one meets every value of every flag in every pattern."""
    out = []
    for p, pattern in enumerate(PATTERNS):
        for (b, bos), (e, eos), (s, sep) in itertools.product(enumerate(FLAG_VALUES), repeat=3):
            out.append(Variant(pattern, bos, eos, sep, (p + b + e + s) % len(FLAVOURS)))
    return out


def gguf_bytes(v: Variant) -> bytes:
    arch, pre, type_count = FLAVOURS[v.flavour]
    bos, eos, sep = PATTERNS[v.pattern]
    kvs: list[tuple[str, int, Any]] = [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, f"tiny-{arch}"),
        (f"{arch}.context_length", U32, 512),
        (f"{arch}.embedding_length", U32, 32),
        (f"{arch}.feed_forward_length", U32, 64),
        (f"{arch}.block_count", U32, 1),
        (f"{arch}.attention.head_count", U32, 2),
        (f"{arch}.attention.layer_norm_epsilon", F32, 1e-12),
        (f"{arch}.attention.causal", BOOL, False),
        (f"{arch}.pooling_type", U32, 2),
        ("tokenizer.ggml.token_type_count", U32, type_count),
        ("tokenizer.ggml.model", STRING, "bert"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, TOKENS)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [k for _, k in VOCAB])),
        ("tokenizer.ggml.bos_token_id", U32, bos),
        ("tokenizer.ggml.eos_token_id", U32, eos),
        ("tokenizer.ggml.unknown_token_id", U32, UNK),
        ("tokenizer.ggml.seperator_token_id", U32, sep),
        ("tokenizer.ggml.padding_token_id", U32, PAD),
        ("tokenizer.ggml.mask_token_id", U32, MASK),
    ]
    for key, value in (("bos", v.add_bos), ("eos", v.add_eos), ("sep", v.add_sep)):
        if value is not None:
            kvs.append((f"tokenizer.ggml.add_{key}_token", BOOL, value))
    return GGUF(kvs=kvs).build()


#: The four ways each text is tokenized: (add_special, parse_special).
MODES = ((False, True), (False, False), (True, True), (True, False))


def _mode_key(add_special: bool, parse_special: bool) -> str:
    return f"add_special={str(add_special).lower()},parse_special={str(parse_special).lower()}"


MODE_KEYS = [_mode_key(a, p) for a, p in MODES]


def reference(path: Path) -> dict[str, Any]:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab

    def tid(t: int) -> int | None:
        return t if t >= 0 else None

    facts = {
        "bos": tid(llama_cpp.llama_vocab_bos(vocab)),
        "eos": tid(llama_cpp.llama_vocab_eos(vocab)),
        "sep": tid(llama_cpp.llama_vocab_sep(vocab)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "add_sep": bool(llama_cpp.llama_vocab_get_add_sep(vocab)),
    }
    ids = {
        key: [[int(i) for i in llm.tokenize(t.encode(), add_bos=add, special=parse)] for t in TEXTS]
        for key, (add, parse) in zip(MODE_KEYS, MODES, strict=True)
    }
    return {"facts": facts, "ids": ids}


def files_sha256(datas: list[bytes]) -> str:
    """One hash for all the files, in order (shared with the test)."""
    h = hashlib.sha256()
    for data in datas:
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def main() -> None:
    import llama_cpp

    records: list[dict[str, Any]] = []
    # Many files tokenize alike: each distinct set of ids is stored once and
    # the files point at it.
    id_sets: list[dict[str, list[list[int]]]] = []
    datas = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants():
            data = gguf_bytes(v)
            datas.append(data)
            path = Path(tmp) / "vocab.gguf"
            path.write_bytes(data)
            ref = reference(path)
            if ref["ids"] not in id_sets:
                id_sets.append(ref["ids"])
            records.append(
                {"name": v.name, "facts": ref["facts"], "ids": id_sets.index(ref["ids"])}
            )
    head = {
        "llama_cpp_python": llama_cpp.__version__,
        "files_sha256": files_sha256(datas),
        "texts": TEXTS,
        "modes": MODE_KEYS,
    }
    text = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    sets = ",\n".join(json.dumps(ids, ensure_ascii=False) for ids in id_sets)
    body = ",\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    OUT.write_text(
        text + f',\n "id_sets": [\n{sets}\n ],\n "variants": [\n{body}\n ]\n}}\n',
        encoding="utf-8",
    )
    print(
        f"{OUT.name}: {len(records)} files, {len(TEXTS)} texts x {len(MODES)} modes each, "
        f"{len(id_sets)} distinct tokenizations"
    )


if __name__ == "__main__":
    main()
