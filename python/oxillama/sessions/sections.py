"""OXISNAP1 section tags and the codecs of their contents.

See docs/snapshot-format.md for the byte-level specification. Every decoder
here raises :class:`SnapshotFormatError` on malformed input and never reads
outside the section it is given.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from oxillama.errors import SnapshotFormatError

#: Identification, engine settings and provenance (UTF-8 JSON object).
META = 1
#: Token history: n_past little-endian u32 token ids.
TOKENS = 2
#: KV cache of every layer up to n_past, raw little-endian in its dtype.
KV = 3
#: Logits of the last position: n_vocab little-endian f32 (absent when the
#: next step must evaluate anyway, e.g. right after a truncate).
LOGITS = 4
#: Sampler configuration (UTF-8 JSON object, SamplerConfig.to_dict()).
SAMPLER_CONFIG = 5
#: Live sampler state: u64 RNG state, f32 mirostat mu, u32 n, n x u32 history.
SAMPLER_STATE = 6
#: The grammar of the last constrained generation and its live matcher
#: state (UTF-8 JSON object: source, root, state as a list of u32; absent
#: when the session has no grammar).
GRAMMAR = 7
#: Active LoRA adapters (UTF-8 JSON object: ``adapters``, a list of
#: ``name``, ``path``, ``fingerprint`` (BLAKE3 hex of the file), ``scale``,
#: in application order; absent when none is active).
LORA = 8
#: The last position's normalized hidden state (n_embd little-endian f32),
#: written instead of LOGITS when the output head reproduces those logits
#: bit for bit from it: 2.3 KB instead of 196 KB for SmolLM2.
HIDDEN = 9

REQUIRED = (META, TOKENS, KV, SAMPLER_CONFIG, SAMPLER_STATE)
NAMES = {
    META: "meta",
    TOKENS: "tokens",
    KV: "kv",
    LOGITS: "logits",
    SAMPLER_CONFIG: "sampler_config",
    SAMPLER_STATE: "sampler_state",
    GRAMMAR: "grammar",
    LORA: "lora",
    HIDDEN: "hidden",
}

_STATE_HEAD = struct.Struct("<QfI")


def encode_json(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def decode_json(data: memoryview, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SnapshotFormatError(f"{what} section is not valid UTF-8 JSON: {e}") from None
    if not isinstance(obj, dict):
        raise SnapshotFormatError(f"{what} section is not a JSON object")
    return obj


def encode_u32(values: list[int]) -> bytes:
    return np.asarray(values, dtype="<u4").tobytes()


def decode_u32(data: memoryview, what: str) -> list[int]:
    if len(data) % 4:
        raise SnapshotFormatError(f"{what} section length {len(data)} is not a multiple of 4")
    return np.frombuffer(data, dtype="<u4").astype(np.int64).tolist()  # type: ignore[no-any-return]


def encode_f32(values: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def decode_f32(data: memoryview, n: int, what: str) -> npt.NDArray[np.float32]:
    if len(data) != 4 * n:
        raise SnapshotFormatError(f"{what} section has {len(data)} bytes, expected {4 * n}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def encode_sampler_state(state: dict[str, Any]) -> bytes:
    history = [int(t) for t in state["history"]]
    head = _STATE_HEAD.pack(int(state["rng"]), float(state["mirostat_mu"]), len(history))
    return head + encode_u32(history)


def decode_sampler_state(data: memoryview) -> dict[str, Any]:
    if len(data) < _STATE_HEAD.size:
        raise SnapshotFormatError("sampler_state section is truncated")
    rng, mu, n = _STATE_HEAD.unpack_from(data)
    rest = data[_STATE_HEAD.size :]
    if len(rest) != 4 * n:
        raise SnapshotFormatError(
            f"sampler_state announces {n} history tokens but holds {len(rest)} bytes"
        )
    return {"rng": rng, "mirostat_mu": mu, "history": decode_u32(rest, "sampler_state")}
