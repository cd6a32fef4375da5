"""KV cache types: f32, f16 and ggml's q8_0 and q4_0 blocks.

Keys and values may use different types (llama.cpp's ``--cache-type-k``
and ``--cache-type-v``); the native layer names such a pair ``"k/v"``
(``"q8_0/f16"``), and a single name when both agree."""

from __future__ import annotations

from oxillama.errors import ParameterError

#: The KV cache types, as llama.cpp names them.
KV_TYPES = ("f32", "f16", "q8_0", "q4_0")


def _check(name: object, what: str) -> str:
    if not isinstance(name, str) or name not in KV_TYPES:
        raise ParameterError(
            f"unknown KV cache type {name!r} for {what}: expected one of {', '.join(KV_TYPES)}"
        )
    return name


def kv_types(kv_dtype: str = "f16", k: str | None = None, v: str | None = None) -> str:
    """The native name of the KV types: ``kv_dtype`` for both sides unless
    ``k`` or ``v`` names one side's own type."""
    if isinstance(kv_dtype, str) and "/" in kv_dtype:
        base_k, base_v = kv_dtype.split("/", 1)
    else:
        base_k = base_v = kv_dtype
    tk = _check(k if k is not None else base_k, "kv_dtype_k" if k is not None else "kv_dtype")
    tv = _check(v if v is not None else base_v, "kv_dtype_v" if v is not None else "kv_dtype")
    return tk if tk == tv else f"{tk}/{tv}"


def kv_row_bytes(kv_dtype: str, dim: int) -> int:
    """Bytes of one cached row of ``dim`` elements in one side's type."""
    if kv_dtype == "f32":
        return 4 * dim
    if kv_dtype == "f16":
        return 2 * dim
    blocks = dim // 32
    return blocks * (34 if kv_dtype == "q8_0" else 18)


def kv_position_bytes(kv_dtype: str, n_layer: int, n_head_kv: int, dim_k: int, dim_v: int) -> int:
    """Bytes one position takes in the cache (and in a snapshot)."""
    tk, _, tv = kv_dtype.partition("/")
    tv = tv or tk
    return n_layer * n_head_kv * (kv_row_bytes(tk, dim_k) + kv_row_bytes(tv, dim_v))
