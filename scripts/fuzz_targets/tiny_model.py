"""A runnable llama-architecture GGUF of about 20 KB: SmolLM2's first
tokens, merges and chat template on one small random layer. Seeds the
binary fuzz targets: a mutation of it reaches the model loader, the
tokenizer builder, the chat template and the forward pass, which a bare
header never does, and snapshots of it are a few kilobytes."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from oxillama import _native
from oxillama.model.paths import default_model_path
from tests._gguf_builder import ARRAY, BOOL, F32, GGUF, I32, STRING, U32, Tensor

N_VOCAB = 320
N_EMBD, N_FF, N_HEAD, N_HEAD_KV = 32, 64, 2, 1
GGML_F32, GGML_Q8_0 = 0, 8


@functools.cache
def smollm2_metadata() -> dict[str, Any]:
    return dict(_native.GgufFile.open(str(default_model_path())).metadata())


def _q8_0(rows: int, cols: int, rng: np.random.Generator) -> bytes:
    out = bytearray()
    for _ in range(rows * cols // 32):
        out += np.float16(0.02).tobytes() + rng.integers(-127, 128, 32, dtype=np.int8).tobytes()
    return bytes(out)


def _f32(n: int, value: float = 1.0) -> bytes:
    return np.full(n, value, dtype=np.float32).tobytes()


def _matrix(name: str, cols: int, rows: int, rng: np.random.Generator) -> Tensor:
    return Tensor(name, [cols, rows], GGML_Q8_0, _q8_0(rows, cols, rng))


def tiny_model() -> GGUF:
    meta = smollm2_metadata()
    tokens: list[str] = meta["tokenizer.ggml.tokens"][:N_VOCAB]
    vocab = set(tokens)
    merges = [
        m
        for m in meta["tokenizer.ggml.merges"][:2000]
        if (parts := m.split(" ")) and len(parts) == 2 and {*parts, "".join(parts)} <= vocab
    ]
    rng = np.random.default_rng(21)
    e, ff, kd = N_EMBD, N_FF, N_HEAD_KV * (N_EMBD // N_HEAD)
    return GGUF(
        kvs=[
            ("general.architecture", STRING, "llama"),
            ("general.name", STRING, "oxillama fuzz seed"),
            ("llama.block_count", U32, 1),
            ("llama.context_length", U32, 256),
            ("llama.embedding_length", U32, e),
            ("llama.feed_forward_length", U32, ff),
            ("llama.attention.head_count", U32, N_HEAD),
            ("llama.attention.head_count_kv", U32, N_HEAD_KV),
            ("llama.rope.freq_base", F32, 100000.0),
            ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
            ("llama.rope.dimension_count", U32, e // N_HEAD),
            ("tokenizer.ggml.model", STRING, "gpt2"),
            ("tokenizer.ggml.pre", STRING, "smollm"),
            ("tokenizer.ggml.add_bos_token", BOOL, False),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            (
                "tokenizer.ggml.token_type",
                ARRAY,
                (I32, meta["tokenizer.ggml.token_type"][:N_VOCAB]),
            ),
            ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
            ("tokenizer.ggml.bos_token_id", U32, 1),
            ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.padding_token_id", U32, 2),
            ("tokenizer.chat_template", STRING, meta["tokenizer.chat_template"]),
        ],
        tensors=[
            _matrix("token_embd.weight", e, N_VOCAB, rng),
            Tensor("output_norm.weight", [e], GGML_F32, _f32(e)),
            Tensor("blk.0.attn_norm.weight", [e], GGML_F32, _f32(e)),
            _matrix("blk.0.attn_q.weight", e, e, rng),
            _matrix("blk.0.attn_k.weight", e, kd, rng),
            _matrix("blk.0.attn_v.weight", e, kd, rng),
            _matrix("blk.0.attn_output.weight", e, e, rng),
            Tensor("blk.0.ffn_norm.weight", [e], GGML_F32, _f32(e)),
            _matrix("blk.0.ffn_gate.weight", e, ff, rng),
            _matrix("blk.0.ffn_up.weight", e, ff, rng),
            _matrix("blk.0.ffn_down.weight", ff, e, rng),
        ],
    )


@functools.cache
def tiny_model_bytes() -> bytes:
    return tiny_model().build()
