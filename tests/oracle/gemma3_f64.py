"""A float64 numpy forward pass of a gemma3 GGUF (see llama_f64.py for the
idea). Gemma 3 as llama.cpp reads it: embeddings scaled by sqrt(n_embd);
RMSNorm weights stored with Gemma's +1 already added by the converter;
per-head RMSNorm on Q and K; NeoX-order RoPE; sliding-window layers (all
but every ``sliding_window_pattern``-th) with their own RoPE base and no
RoPE scaling, global layers with ``freq_base`` and the file's linear
scaling; attention scaled by 1/sqrt(key_length); norms after attention and
after the feed-forward block as well as before; GELU (tanh) gating; the
output head tied to the embedding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def _get(r: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    f = r.fields.get(key)
    return default if f is None else f.contents()


class Gemma3F64:
    """``gelu_f16=True`` evaluates GELU as ggml does (input rounded to f16,
    the result looked up as f16): the exact math otherwise."""

    def __init__(self, path: Path, *, gelu_f16: bool = False) -> None:
        self.gelu_f16 = gelu_f16
        r = gguf.GGUFReader(str(path))
        a = "gemma3"
        self.n_layer = int(_get(r, f"{a}.block_count"))
        self.n_head = int(_get(r, f"{a}.attention.head_count"))
        self.n_kv = int(_get(r, f"{a}.attention.head_count_kv"))
        self.eps = float(_get(r, f"{a}.attention.layer_norm_rms_epsilon"))
        self.hd = int(_get(r, f"{a}.attention.key_length"))
        self.base = float(_get(r, f"{a}.rope.freq_base"))
        self.base_swa = float(_get(r, f"{a}.rope.freq_base_swa", 10000.0))
        self.window = int(_get(r, f"{a}.attention.sliding_window"))
        self.pattern = int(_get(r, f"{a}.attention.sliding_window_pattern", 6))
        kind = _get(r, f"{a}.rope.scaling.type", "none")
        if kind not in ("none", "linear"):
            raise ValueError(f"the oracle does not model rope scaling {kind!r}")
        factor = float(_get(r, f"{a}.rope.scaling.factor", 1.0)) if kind == "linear" else 1.0
        self.global_pos_scale = 1.0 / factor
        self.w: dict[str, F64] = {}
        for t in r.tensors:
            self.w[t.name] = np.asarray(
                gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64
            )
        emb = self.w["token_embd.weight"]
        self.d = emb.shape[1]
        self.head = self.w.get("output.weight", emb)

    def is_swa(self, layer: int) -> bool:
        return self.pattern == 0 or layer % self.pattern < self.pattern - 1

    def _rms(self, x: F64, w: F64) -> F64:
        out: F64 = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w
        return out

    def _rope(self, x: F64, pos: npt.NDArray[np.int64], base: float, scale: float) -> F64:
        """NeoX order: element i pairs with i + hd/2."""
        half = self.hd // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2 / self.hd)
        ang = (pos[:, None] * scale * inv[None, :])[:, None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        a, b = x[..., :half], x[..., half:]
        out: F64 = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        return out

    def logits(self, tokens: list[int]) -> F64:
        w, T = self.w, len(tokens)
        x = w["token_embd.weight"][np.asarray(tokens)] * math.sqrt(self.d)
        pos = np.arange(T)
        causal = np.triu(np.full((T, T), -np.inf), 1)
        local = causal + np.where(pos[:, None] - pos[None, :] >= self.window, -np.inf, 0.0)
        group = self.n_head // self.n_kv
        for i in range(self.n_layer):
            p = f"blk.{i}."
            swa = self.is_swa(i)
            base, scale = (self.base_swa, 1.0) if swa else (self.base, self.global_pos_scale)
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, self.hd)
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.hd)
            q = self._rope(self._rms(q, w[p + "attn_q_norm.weight"]), pos, base, scale)
            k = self._rope(self._rms(k, w[p + "attn_k_norm.weight"]), pos, base, scale)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            s = np.einsum("thd,uhd->htu", q, k) / math.sqrt(self.hd) + (local if swa else causal)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = np.einsum("htu,uhd->thd", s, v).reshape(T, self.n_head * self.hd)
            o = att @ w[p + "attn_output.weight"].T
            x = x + self._rms(o, w[p + "post_attention_norm.weight"])
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            if self.gelu_f16:
                g = g.astype(np.float16).astype(np.float64)
            gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
            if self.gelu_f16:
                gelu = np.where(g > 10, g, np.where(g < -10, 0.0, gelu))
                gelu = gelu.astype(np.float16).astype(np.float64)
            f = (gelu * u) @ w[p + "ffn_down.weight"].T
            x = x + self._rms(f, w[p + "post_ffw_norm.weight"])
        out: F64 = self._rms(x, w["output_norm.weight"]) @ self.head.T
        return out
