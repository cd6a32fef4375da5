"""A float64 numpy forward pass of a llama-architecture GGUF, from the
weights as ``gguf`` (llama.cpp's own package) dequantizes them: the exact
math both engines approximate (they quantize activations to 8 bits and
accumulate in float32). Written from the architecture's definition, in the
style of llm.c's reference: plain, one position block at a time.

Layout as llama.cpp's converter writes it: weights are ``(n_out, n_in)``,
Q and K are permuted for the adjacent-pair ("normal") RoPE (with
``rope_freqs.weight`` dividing the frequencies when present), the output
head is ``token_embd`` when ``output.weight`` is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

#: The teacher-forced text of the fidelity test and bench (fixed, so the
#: figures do not move when other files change).
TEXT = (
    "The river rose in the hills above the town, where the snow melted early in "
    "spring. By May it ran fast and cold past the mill, and the miller's children "
    "were told to keep away from the bank. Nobody listened. In the evenings they "
    "raced paper boats from the bridge to the weir, and the winner was the one "
    "whose boat went over first. Their grandmother, who had seen three floods, "
    "said the river kept a list of everyone who laughed at it. In 1911 the water "
    "reached the church steps; in 1934 it took the old footbridge and two cows. "
    "def count_boats(boats: list[str]) -> dict[str, int]:\n"
    "    totals = {}\n    for b in boats:\n        totals[b] = totals.get(b, 0) + 1\n"
    "    return totals\n"
    "Questions for the reader: why did the miller build so close to the water, "
    "and what would you have done? Answers vary, but most readers say the same "
    "thing: the mill needed the river more than it feared it."
)


def _field(r: gguf.GGUFReader, key: str) -> Any:
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v.tolist()[0] if hasattr(v, "tolist") else v


class LlamaF64:
    def __init__(self, path: Path) -> None:
        r = gguf.GGUFReader(str(path))
        arch = "llama"
        self.n_layer = int(_field(r, f"{arch}.block_count"))
        self.n_head = int(_field(r, f"{arch}.attention.head_count"))
        self.n_kv = int(_field(r, f"{arch}.attention.head_count_kv"))
        self.eps = float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon"))
        self.base = float(_field(r, f"{arch}.rope.freq_base"))
        # Linear RoPE scaling divides positions; other kinds are not modelled.
        self.pos_scale = 1.0
        kind = r.fields.get(f"{arch}.rope.scaling.type")
        if kind is not None and kind.contents() not in ("none", "linear"):
            raise ValueError(f"the oracle does not model rope scaling {kind.contents()!r}")
        if kind is not None and kind.contents() == "linear":
            self.pos_scale = 1.0 / float(_field(r, f"{arch}.rope.scaling.factor"))
        self.w: dict[str, F64] = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(a, dtype=np.float64)
        emb = self.w["token_embd.weight"]
        self.head = self.w.get("output.weight", emb)
        self.d = emb.shape[1]
        self.hd = self.d // self.n_head

    def _rms(self, x: F64, w: F64) -> F64:
        out: F64 = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w
        return out

    def _rope(self, x: F64, pos: npt.NDArray[np.int64]) -> F64:
        """Adjacent pairs (2i, 2i+1) rotated by pos * base^(-2i/hd)."""
        half = self.hd // 2
        inv = self.base ** (-np.arange(half, dtype=np.float64) * 2 / self.hd)
        factors = self.w.get("rope_freqs.weight")
        if factors is not None:  # Llama 3's long-context frequency factors
            inv = inv / factors.reshape(-1)[:half]
        ang = pos[:, None].astype(np.float64) * self.pos_scale * inv[None, :]  # (T, half)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    def logits(self, tokens: list[int]) -> F64:
        """``(len(tokens), n_vocab)`` logits, every position (causal)."""
        w, T = self.w, len(tokens)
        x = w["token_embd.weight"][np.asarray(tokens)]
        pos = np.arange(T)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        group = self.n_head // self.n_kv
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, self.hd)
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.hd)
            q, k = self._rope(q, pos), self._rope(k, pos)
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(self.hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = np.einsum("htu,uhd->thd", s, v).reshape(T, self.d)
            x = x + att @ w[p + "attn_output.weight"].T
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        out: F64 = self._rms(x, w["output_norm.weight"]) @ self.head.T
        return out


def log_softmax(x: npt.NDArray[Any]) -> F64:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    out: F64 = x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))
    return out


def kl_rows(oracle: npt.NDArray[Any], other: npt.NDArray[Any]) -> F64:
    """Per position KL(oracle || other) of the two logit rows' softmaxes."""
    lo, lt = log_softmax(oracle), log_softmax(other)
    out: F64 = (np.exp(lo) * (lo - lt)).sum(-1)
    return out
