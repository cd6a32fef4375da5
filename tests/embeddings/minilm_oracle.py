"""A float64 numpy forward pass of all-MiniLM-L6-v2 straight from the
package's safetensors, tokenized by its own tokenizer.json, with
sentence-transformers' mean pooling and normalization: the reference that
does not go through GGUF, f16 weights or llama.cpp.

BERT in full: embeddings (word + position + token type 0), LayerNorm;
per layer self-attention with biases over the whole sentence, add,
LayerNorm; exact (erf) GELU MLP, add, LayerNorm.
"""

from __future__ import annotations

import itertools
import json
import math
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from tokenizers import Tokenizer

_erf = np.frompyfunc(math.erf, 1, 1)


class MiniLMOracle:
    def __init__(self, zip_path: Path) -> None:
        with zipfile.ZipFile(zip_path) as zf:
            weights = load_safetensors(zf.read("model.safetensors"))
            self.cfg = json.loads(zf.read("config.json"))
            self.tokenizer = Tokenizer.from_str(zf.read("tokenizer.json").decode())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}
        self._t: dict[str, np.ndarray] = {}

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        eps = self.cfg["layer_norm_eps"]
        return (x - mu) / np.sqrt(var + eps) * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _lin(self, x: np.ndarray, name: str) -> np.ndarray:
        wt = self._t.get(name)
        if wt is None:
            wt = self._t[name] = np.ascontiguousarray(self.w[f"{name}.weight"].T)
        return x @ wt + self.w[f"{name}.bias"]

    def hidden(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """Last hidden states of each sentence; the row-wise layers run on
        all sentences' rows at once, attention within each sentence."""
        w = self.w
        bounds = np.cumsum([0] + [len(s) for s in seqs])
        pos = np.concatenate([np.arange(len(s)) for s in seqs])
        x = (
            w["embeddings.word_embeddings.weight"][np.concatenate(seqs)]
            + w["embeddings.position_embeddings.weight"][pos]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._ln(x, "embeddings.LayerNorm")
        heads = self.cfg["num_attention_heads"]
        d = x.shape[1] // heads
        for il in range(self.cfg["num_hidden_layers"]):
            p = f"encoder.layer.{il}"
            q, k, v = (self._lin(x, f"{p}.attention.self.{m}") for m in ("query", "key", "value"))
            ctx = np.empty_like(x)
            for a, b in itertools.pairwise(bounds):
                qh, kh, vh = (t[a:b].reshape(b - a, heads, d).transpose(1, 0, 2) for t in (q, k, v))
                s = qh @ kh.transpose(0, 2, 1) / math.sqrt(d)
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                ctx[a:b] = (s @ vh).transpose(1, 0, 2).reshape(b - a, heads * d)
            attn = self._lin(ctx, f"{p}.attention.output.dense")
            x = self._ln(x + attn, f"{p}.attention.output.LayerNorm")
            h = self._lin(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)).astype(np.float64))
            x = self._ln(x + self._lin(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        return [x[a:b] for a, b in itertools.pairwise(bounds)]

    def embed(self, texts: list[str]) -> np.ndarray:
        """sentence-transformers' Pooling(mean) then Normalize, per text."""
        v = np.array([h.mean(0) for h in self.hidden([self.ids(t) for t in texts])])
        return v / np.linalg.norm(v, axis=1, keepdims=True)


@cache
def oracle(zip_path: Path) -> MiniLMOracle:
    return MiniLMOracle(zip_path)
