"""OXISPEC1 metadata with out-of-range numbers (found by the oxispec fuzz
target: a PCG64 state word past 128 bits made numpy raise OverflowError)
is a SnapshotFormatError, never an untyped numpy error."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from oxillama import Engine, SamplerConfig, SpeculativeEngine
from oxillama.sessions import sections as S
from oxillama.sessions import spec as spec_format
from oxillama.sessions.format import Section, decode, encode
from oxillama.snapshot import SnapshotFormatError
from tests.models import _checks as arch


@pytest.fixture(scope="module")
def blob() -> bytes:
    path = arch.reference("llama").path
    spec = SpeculativeEngine(
        Engine(path, context_size=64, sampler=SamplerConfig(temperature=0.7)),
        Engine(path, context_size=64),
        num_speculative=2,
        seed=5,
    )
    spec.generate([1, 2, 3], 4, ignore_eos=True)
    return spec_format.dumps(spec)


def with_meta(blob: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    _, secs = decode(blob, magic=spec_format.MAGIC)
    meta = json.loads(bytes(secs[spec_format.META]))
    edit(meta)
    parts = [Section(spec_format.META, S.encode_json(meta))]
    parts += [Section(t, bytes(secs[t])) for t in (spec_format.TARGET, spec_format.DRAFT)]
    return encode(parts, magic=spec_format.MAGIC, version=spec_format.VERSION)


def test_the_unedited_image_loads(blob: bytes) -> None:
    assert spec_format.loads(with_meta(blob, lambda m: None)).seed == 5


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["rng"]["state"].update(state=2**200),
        lambda m: m["rng"]["state"].update(inc=-(2**130)),
        lambda m: m.update(draft_key=2**64),
        lambda m: m.update(draft_key=-1),
        lambda m: m.update(seed=2**70),
        lambda m: m.update(seed=True),
    ],
)
def test_out_of_range_numbers_are_format_errors(
    blob: bytes, edit: Callable[[dict[str, Any]], None]
) -> None:
    with pytest.raises(SnapshotFormatError):
        spec_format.loads(with_meta(blob, edit))
