"""The Rust quantizers against ggml's, byte for byte: every format we write,
on rows made to trip them (tests/_quant_rows.py), with and without an
importance vector, hashed as ggml_quantize_chunk wrote them
(tests/reference/quantize_rows.json, from scripts/make_quantize_refs.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from oxillama import _native
from oxillama.model.quantize.ftypes import GGML_TYPES, row_bytes
from tests._quant_rows import N_PER_ROW, importance, rows

REFS = json.loads((Path(__file__).parent / "reference" / "quantize_rows.json").read_text())
X = rows().reshape(-1)
W = importance()


@pytest.mark.parametrize("key", sorted(REFS))
def test_rows_equal_ggml(key: str) -> None:
    name, how = key.split("/")
    t = GGML_TYPES[name]
    out = _native.quantize_rows(t, X, N_PER_ROW, W if how == "imatrix" else None, 2)
    assert len(out) == row_bytes(t, N_PER_ROW) * (X.size // N_PER_ROW)
    assert hashlib.sha256(out).hexdigest() == REFS[key]


@pytest.mark.parametrize("name", ["Q4_K", "IQ2_XS", "IQ1_M"])
def test_bytes_do_not_depend_on_threads(name: str) -> None:
    big = np.tile(rows(), (8, 1)).reshape(-1)
    t = GGML_TYPES[name]
    one = _native.quantize_rows(t, big, N_PER_ROW, W, 1)
    assert _native.quantize_rows(t, big, N_PER_ROW, W, 2) == one
    assert _native.quantize_rows(t, big, N_PER_ROW, W, 3) == one


def test_bad_shapes_and_types_are_refused() -> None:
    q4k = GGML_TYPES["Q4_K"]
    with pytest.raises(ValueError, match="not whole rows"):
        _native.quantize_rows(q4k, X[:100], N_PER_ROW)
    with pytest.raises(ValueError, match="Q4_K blocks of 256"):
        _native.quantize_rows(q4k, X[:384], 384)
    with pytest.raises(ValueError, match="importance vector of 3"):
        _native.quantize_rows(q4k, X, N_PER_ROW, W[:3])
    with pytest.raises(ValueError, match="no quantizer writes Q8_K"):
        _native.quantize_rows(GGML_TYPES["Q8_K"], X, N_PER_ROW)
    assert not _native.can_quantize(GGML_TYPES["Q8_K"])
    assert _native.can_quantize(GGML_TYPES["IQ4_XS"])
    assert _native.can_quantize(GGML_TYPES["IQ1_M"])


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ1_S"])
def test_types_ggml_fits_only_with_weights_need_an_importance_vector(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} needs an importance vector"):
        _native.quantize_rows(GGML_TYPES[name], X, N_PER_ROW)


CODEBOOK_TYPES = ["IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]


@pytest.mark.parametrize("name", CODEBOOK_TYPES)
def test_codebook_types_take_non_finite_rows_without_failing(name: str) -> None:
    """ggml aborts on some of these; we must write whole rows and return."""
    x = rows()[:4].copy()
    x[0, 3] = np.nan
    x[1, :40] = np.nan
    x[2, 7] = np.inf
    x[3, 300] = -np.inf
    x[3, 301] = 3e38
    w = W.copy()
    w[5] = np.inf
    w[6] = np.nan
    for qw in (w, W):
        out = _native.quantize_rows(GGML_TYPES[name], x.reshape(-1), N_PER_ROW, qw, 2)
        assert len(out) == row_bytes(GGML_TYPES[name], N_PER_ROW) * 4
