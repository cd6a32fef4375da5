"""Cutting a session's exported KV into blocks of positions (which
``Session.import_kv_at`` takes back one after another).

``Session.export_kv`` lays the cache out per layer: the K rows of each head
(all positions in order), then the V rows of each head. A block keeps the
same order restricted to its positions: it is the export of those
positions (per layer, each head's K rows, then each head's V rows). Rows stay in the session's KV
type (f16, q8_0 or q4_0 blocks), so a quantized cache stores smaller blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from oxillama.engine.kv_types import kv_row_bytes
from oxillama.errors import ParameterError


@dataclass(frozen=True)
class KvLayout:
    n_head_kv: int
    row_k: int  # bytes of one head's K row
    row_v: int

    @classmethod
    def of(cls, config: dict[str, object], kv_dtype: str) -> KvLayout:
        tk, _, tv = kv_dtype.partition("/")
        h, dk, dv = (int(config[k]) for k in ("n_head_kv", "dim_k", "dim_v"))  # type: ignore[call-overload]
        if h <= 0:
            raise ParameterError("kv_store: the model has no KV heads")
        return cls(h, kv_row_bytes(tk, dk), kv_row_bytes(tv or tk, dv))

    @property
    def position_bytes(self) -> int:
        """Bytes of one position in one layer."""
        return self.n_head_kv * (self.row_k + self.row_v)

    def _views(
        self, flat: npt.NDArray[np.uint8], n: int
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        """K and V views ``(layer, head, position, byte)`` of an export of
        ``n`` positions (no copies: writes go through to ``flat``)."""
        per = n * self.position_bytes
        if per == 0 or flat.size % per:
            raise ParameterError(
                f"kv_store: {flat.size} bytes are not a KV export of {n} positions"
            )
        layers = flat.reshape(flat.size // per, per)
        split = self.n_head_kv * n * self.row_k
        k = layers[:, :split].view()
        k.shape = (layers.shape[0], self.n_head_kv, n, self.row_k)
        v = layers[:, split:].view()
        v.shape = (layers.shape[0], self.n_head_kv, n, self.row_v)
        return k, v

    def split(self, export: bytes, n: int, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """The blocks of positions ``[a, b)`` for each span of an export of
        ``n`` positions: each is itself the export of its positions (per
        layer, the K rows of each head, then the V rows), which
        ``Session.import_kv_at`` writes back where they lie."""
        k, v = self._views(np.frombuffer(export, dtype=np.uint8), n)
        n_layer = k.shape[0]
        return [
            np.concatenate(
                (k[:, :, a:b].reshape(n_layer, -1), v[:, :, a:b].reshape(n_layer, -1)), axis=1
            ).tobytes()
            for a, b in spans
        ]
