"""What the per-architecture suite covers: every committed reference is
checked by some family's test file, and every fixture holds every weight
format, so each architecture runs each format's kernels against llama.cpp."""

from __future__ import annotations

import numpy as np

from tests.models import (
    _checks as c,
)
from tests.models import (  # modules, not their classes, which would run again here
    test_command_r,
    test_gemma_family,
    test_llama_family,
    test_mamba2,
    test_olmo2,
    test_phi3,
    test_starcoder2,
)
from tests.models._weights import FORMATS
from tests.models.make_fixtures import FIXTURES

FAMILIES = (
    test_llama_family.TestLlamaFamily,
    test_gemma_family.TestGemmaFamily,
    test_phi3.TestPhi3,
    test_command_r.TestCommandR,
    test_starcoder2.TestStarcoder2,
    test_olmo2.TestOlmo2,
    test_mamba2.TestMamba2,
)


def test_every_reference_is_checked_once() -> None:
    names = [n for family in FAMILIES for n in family.names]
    assert sorted(names) == sorted(c.REFERENCES)
    assert {c.reference(n).fixture for n in names} == set(FIXTURES)


def test_every_fixture_holds_every_weight_format() -> None:
    want = {f.name for f in FORMATS}
    for name in c.REFERENCES:
        z = np.load(c.HERE / "reference" / f"{name}.npz")
        assert set(z["tensor_formats"].tolist()) == want, name
