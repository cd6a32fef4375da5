"""Three tiny BERT cross-encoder rerankers, written as llama.cpp's converter
(``conversion/bert.py``) writes one, and llama.cpp's scores for them.

    pip install llama-cpp-python==0.3.36 gguf   # builds llama.cpp (~10 min)
    python tests/reference/make_rerank_reference.py

writes ``rerank_<name>.gguf`` (the fixtures, committed) and
``rerank.json`` next to this file.

The fixtures are 2-layer BERTs of width 32 with random weights from a
fixed seed, all F32 (the converter's ``--outtype f32``: with F16 weights
llama.cpp rounds every activation to F16 before each product, which moves
these random, unnormalized scores by up to 0.5%, more than the 1e-3 the
test holds us to), a WordPiece vocabulary (the one of
``make_bert_specials_reference``) and a classifier head:

- ``direct``: laid out key for key as the converter of llama-cpp-python
  0.3.36's llama.cpp (``convert_hf_to_gguf.py --outtype f32``) writes a
  ``BertForSequenceClassification`` with one label and a tokenizer.json
  (checked against its output for a tiny random model): ``cls.output.*``
  only (the single projection of the ms-marco MiniLM cross-encoders), one
  ``bert.classifier.output_labels`` entry, no ``bert.pooling_type`` (the
  converter writes none for a cross-encoder: llama-server's
  ``--reranking`` asks for rank pooling), the flags it reads from the
  pair template ``[CLS] A [SEP] B [SEP]`` (add_bos and add_eos on,
  add_sep off, EOS = [SEP]) and ``normalizer.lowercase``;
- ``roberta``: ``cls.weight``/``cls.bias`` then ``cls.output.*`` (a
  classification head with a dense layer, as XLM-RoBERTa's), with
  ``bert.pooling_type`` = 4 (RANK) and no add_* flags or EOS (WordPiece's
  defaults, as from a vocab.txt: add_bos and add_sep on, add_eos off);
- ``template``: ``direct`` with a ``tokenizer.chat_template.rerank``, the
  prompt llama-server then fills with ``{query}`` and ``{document}`` and
  tokenizes with special-token text read as those tokens.

llama.cpp's scores come from llama-cpp-python's rank pooling:
``Llama(path, embedding=True, pooling_type=4)``, one sequence per decode,
``llama_get_embeddings_seq(ctx, 0)[0]`` (the first classifier output, which
llama-server returns as ``relevance_score``). The token ids of each pair
are built as llama-server's ``format_prompt_rerank`` builds them: BOS (if
add_bos), the query, EOS (if add_eos; [SEP] when there is no EOS), [SEP]
(if add_sep), the document, EOS (if add_eos); texts tokenized without
special tokens. The JSON keeps the ids and the score of every pair and the
fixtures' sha256. Deterministic: re-running on the same build rewrites the
same files.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
OUT = HERE / "rerank.json"
sys.path.insert(0, str(HERE.parent.parent))

from tests.reference.make_bert_specials_reference import (  # noqa: E402
    CLS,
    MASK,
    PAD,
    SEP,
    UNK,
    VOCAB,
)

N_EMBD, N_HEAD, N_FF, N_LAYER, N_POS = 32, 4, 64, 2, 128
EPS = 1e-12
SEED = 56


@dataclass(frozen=True)
class Flavour:
    name: str
    #: The dense layer before the output projection (cls.weight, cls.bias).
    dense: bool
    #: The converter's add_* flags (None: the key is absent) and EOS.
    add_bos: bool | None
    add_eos: bool | None
    add_sep: bool | None
    eos: int | None
    #: ``bert.pooling_type`` (None: the key is absent).
    pooling: int | None
    labels: tuple[str, ...] = ()
    #: ``tokenizer.ggml.normalizer.lowercase`` (None: absent).
    lowercase: bool | None = None
    #: ``tokenizer.chat_template.rerank`` (None: absent).
    template: str | None = None
    #: For the tests' variants: no output layer; the head's matrices in
    #: another ggml type (as llama-quantize may leave them).
    output: bool = True
    head_type: str = "F32"


FLAVOURS = (
    Flavour(
        "roberta",
        dense=True,
        add_bos=None,
        add_eos=None,
        add_sep=None,
        eos=None,
        pooling=4,
    ),
    Flavour(
        "direct",
        dense=False,
        add_bos=True,
        add_eos=True,
        add_sep=False,
        eos=SEP,
        pooling=None,
        labels=("LABEL_0",),
        lowercase=True,
    ),
    Flavour(
        "template",
        dense=False,
        add_bos=True,
        add_eos=True,
        add_sep=False,
        eos=SEP,
        pooling=None,
        template="[CLS]query: {query}[SEP]document: {document}[SEP]",
    ),
)

QUERIES = ["what is the capital of france?", "hello world"]
DOCUMENTS = [
    "paris is the capital of france.",
    "the cat sat on the mat",
    "hello world",
    "berlin is in germany, and it is big!",
    "a naive token embed",
    "",
]


def fixture_path(name: str) -> Path:
    return HERE / f"rerank_{name}.gguf"


def write_fixture(f: Flavour, path: Path) -> None:
    import gguf

    rng = np.random.default_rng([SEED, *f.name.encode()])

    def mat(rows: int, cols: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def vec(n: int, scale: float = 0.1, mean: float = 0.0) -> np.ndarray:
        return (mean + rng.standard_normal(n) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name(f"tiny-reranker-{f.name}")
    w.add_context_length(N_POS)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_eps(EPS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    if f.pooling is not None:
        w.add_pooling_type(gguf.PoolingType(f.pooling))
    if f.labels:
        w.add_classifier_output_labels(list(f.labels))
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in VOCAB])
    w.add_token_types([k for _, k in VOCAB])
    w.add_bos_token_id(CLS)
    if f.eos is not None:
        w.add_eos_token_id(f.eos)
    w.add_unk_token_id(UNK)
    w.add_sep_token_id(SEP)
    w.add_pad_token_id(PAD)
    w.add_mask_token_id(MASK)
    if f.add_bos is not None:
        w.add_add_bos_token(f.add_bos)
    if f.add_eos is not None:
        w.add_add_eos_token(f.add_eos)
    if f.add_sep is not None:
        w.add_add_sep_token(f.add_sep)
    if f.template is not None:
        w.add_string("tokenizer.chat_template.rerank", f.template)
    if f.lowercase is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", f.lowercase)

    e, ff = N_EMBD, N_FF
    w.add_tensor("token_embd.weight", mat(len(VOCAB), e, 0.5))
    w.add_tensor("token_types.weight", mat(2, e, 0.5))
    w.add_tensor("position_embd.weight", mat(N_POS, e, 0.5))
    w.add_tensor("token_embd_norm.weight", vec(e, 0.1, 1.0))
    w.add_tensor("token_embd_norm.bias", vec(e))
    for il in range(N_LAYER):
        p = f"blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", mat(e, e))
            w.add_tensor(p + name + ".bias", vec(e))
        w.add_tensor(p + "attn_output_norm.weight", vec(e, 0.1, 1.0))
        w.add_tensor(p + "attn_output_norm.bias", vec(e))
        w.add_tensor(p + "ffn_up.weight", mat(ff, e))
        w.add_tensor(p + "ffn_up.bias", vec(ff))
        w.add_tensor(p + "ffn_down.weight", mat(e, ff))
        w.add_tensor(p + "ffn_down.bias", vec(e))
        w.add_tensor(p + "layer_output_norm.weight", vec(e, 0.1, 1.0))
        w.add_tensor(p + "layer_output_norm.bias", vec(e))

    def head(name: str, x: np.ndarray) -> None:
        ty = gguf.GGMLQuantizationType[f.head_type]
        if ty == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, ty), raw_dtype=ty)

    if f.dense:
        head("cls.weight", mat(e, e, 0.4))
        w.add_tensor("cls.bias", vec(e, 0.2))
    if f.output:
        head("cls.output.weight", mat(max(1, len(f.labels)), e, 0.5))
        w.add_tensor("cls.output.bias", vec(max(1, len(f.labels)), 0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pair_ids(llama: Any, query: str, doc: str) -> list[int]:
    """llama-server's format_prompt_rerank, through llama.cpp's own vocab."""
    import llama_cpp

    template = llama_cpp.llama_model_chat_template(llama.model, b"rerank")
    if template is not None:
        prompt = template.decode().replace("{query}", query).replace("{document}", doc)
        ids: list[int] = llama.tokenize(prompt.encode(), add_bos=False, special=True)
        return ids
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    q = llama.tokenize(query.encode(), add_bos=False, special=False)
    d = llama.tokenize(doc.encode(), add_bos=False, special=False)
    eos = llama_cpp.llama_vocab_eos(vocab)
    if eos == llama_cpp.LLAMA_TOKEN_NULL:
        eos = llama_cpp.llama_vocab_sep(vocab)
    ids = []
    if llama_cpp.llama_vocab_get_add_bos(vocab):
        ids.append(llama_cpp.llama_vocab_bos(vocab))
    ids += q
    if llama_cpp.llama_vocab_get_add_eos(vocab):
        ids.append(eos)
    if llama_cpp.llama_vocab_get_add_sep(vocab):
        ids.append(llama_cpp.llama_vocab_sep(vocab))
    ids += d
    if llama_cpp.llama_vocab_get_add_eos(vocab):
        ids.append(eos)
    return ids


def _score(llama: Any, ids: list[int]) -> float:
    import llama_cpp

    llama._ctx.kv_cache_clear()
    llama._batch.reset()
    llama._batch.add_sequence(ids, 0, True)
    llama._ctx.decode(llama._batch)
    ptr = llama_cpp.llama_get_embeddings_seq(llama._ctx.ctx, 0)
    return float(ptr[0])


def reference(f: Flavour) -> dict[str, Any]:
    import llama_cpp

    llama = llama_cpp.Llama(
        str(fixture_path(f.name)),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
        n_ctx=N_POS,
        n_batch=N_POS,
        n_ubatch=N_POS,
        n_threads=2,
        verbose=False,
    )
    pairs = []
    for q in QUERIES:
        for d in DOCUMENTS:
            ids = _pair_ids(llama, q, d)
            pairs.append({"query": q, "document": d, "ids": ids, "score": _score(llama, ids)})
    return {"name": f.name, "sha256": sha256(fixture_path(f.name)), "pairs": pairs}


def main() -> None:
    import llama_cpp

    for f in FLAVOURS:
        write_fixture(f, fixture_path(f.name))
    data = {
        "llama_cpp_python": llama_cpp.__version__,
        "queries": QUERIES,
        "documents": DOCUMENTS,
        "fixtures": [reference(f) for f in FLAVOURS],
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n", "utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
