"""KV written by decoding is the KV a prefill of the same tokens writes, to
the bit, at any depth: the attention of one new token sums its values as a
prefill's does (the same fixed chunks in the same order), so a continuation
from decoded tokens equals a prefill of the whole text. Stored responses,
the prefix store and forks rely on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxillama import Engine

TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "Early machines were programmed by rewiring; later, stored programs let the same "
    "hardware run many tasks. "
)


@pytest.mark.parametrize(("n0", "k"), [(100, 2), (150, 12), (200, 10), (330, 40)])
def test_decoded_tokens_leave_a_prefills_kv(model_path: Path, n0: int, k: int) -> None:
    probe = Engine(model_path, context_size=512)
    toks = probe.tokenize(TEXT * 12)[: n0 + k]
    whole = Engine(model_path, context_size=512, threads=2)
    want = whole.eval(toks)
    stepped = Engine(model_path, context_size=512, threads=2)
    stepped.eval(toks[:n0])
    for t in toks[n0:]:
        got = stepped.forward_one(t)
    np.testing.assert_array_equal(got, want)
    assert stepped._session.export_kv() == whole._session.export_kv()
