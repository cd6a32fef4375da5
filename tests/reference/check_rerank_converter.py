"""By hand: a reranker made by llama.cpp's own converter, scored by us and
by llama.cpp. Not part of the suite (it needs torch, transformers and
llama.cpp's source tree); the fixtures of ``make_rerank_reference.py``
carry its layout into CI.

    pip install torch transformers llama-cpp-python==0.3.36
    python -m tests.reference.check_rerank_converter --llama-cpp SRC

``SRC`` is llama.cpp's source tree (``vendor/llama.cpp`` of the
llama-cpp-python 0.3.36 source distribution). A tiny random
``BertForSequenceClassification`` (one label, the WordPiece vocabulary of
``make_bert_specials_reference``, a tokenizer.json) is saved, converted by
``SRC/convert_hf_to_gguf.py --outtype f32`` and reranked for every pair of
``QUERIES`` x ``DOCUMENTS``: the token ids must be llama-server's and the
scores llama.cpp's (``pooling_type=4``) within 1e-3 relative. The
converter's pre-tokenizer check, which knows only published vocabularies
by hash, is told "default". Prints the largest relative difference.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import tempfile
from pathlib import Path

from tests.reference.make_bert_specials_reference import _bert_vocab
from tests.reference.make_rerank_reference import DOCUMENTS, QUERIES, _pair_ids, _score


def build(folder: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    vocab = [t for t, _ in _bert_vocab() if t != "[END]"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", "utf-8")
    tok = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")


def convert(src: Path, folder: Path, out: Path) -> None:
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    import conversion.base as base  # llama.cpp's converter package

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(folder / "model"), "--outtype", "f32"]
    sys.argv += ["--outfile", str(out)]
    try:
        runpy.run_path(str(src / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv


def compare(path: Path) -> float:
    import llama_cpp

    from oxillama import Engine
    from oxillama.engine.rerank import pair_tokens

    theirs = llama_cpp.Llama(
        str(path), embedding=True, pooling_type=4, n_ctx=128, n_batch=128, n_ubatch=128,
        verbose=False,
    )  # fmt: skip
    ours = Engine(path, context_size=128, threads=1)
    head = ours.model.rank_head
    assert head is not None, "the converted file is not read as a reranker"
    worst = 0.0
    for q in QUERIES:
        got = {r.index: r.relevance_score for r in ours.rerank(q, DOCUMENTS)}
        for i, d in enumerate(DOCUMENTS):
            ids = _pair_ids(theirs, q, d)
            assert pair_tokens(head, ours.tokenizer, q, d) == ids, (q, d)
            want = _score(theirs, ids)
            worst = max(worst, abs(got[i] - want) / abs(want))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source tree")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build(folder)
        convert(args.llama_cpp.resolve(), folder, folder / "reranker.gguf")
        worst = compare(folder / "reranker.gguf")
    print(f"largest relative difference from llama.cpp: {worst:.2e}")
    if worst > 1e-3:
        sys.exit(1)


if __name__ == "__main__":
    main()
