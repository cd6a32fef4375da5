"""What the per-architecture suite covers: every committed reference is
checked by some family's test file, every architecture fixture holds every
weight format, so each architecture runs each format's kernels against
llama.cpp, and each of the newer types has a fixture all in it."""

from __future__ import annotations

import numpy as np

from tests.models import (
    _checks as c,
)
from tests.models import (  # modules, not their classes, which would run again here
    test_command_r,
    test_deepseek2,
    test_gemma3n,
    test_gemma_family,
    test_gpt_oss,
    test_granite_hybrid,
    test_jamba,
    test_lfm2,
    test_llama_family,
    test_mamba2,
    test_olmo2,
    test_phi3,
    test_quant_types,
    test_smollm3,
    test_starcoder2,
)
from tests.models._archs import ALL_FIXTURES, FIXTURES, TYPE_FIXTURES
from tests.models._iq_blocks import NEW_TYPES
from tests.models._weights import FORMATS

FAMILIES = (
    test_llama_family.TestLlamaFamily,
    test_gemma_family.TestGemmaFamily,
    test_gemma3n.TestGemma3n,
    test_gpt_oss.TestGptOss,
    test_phi3.TestPhi3,
    test_command_r.TestCommandR,
    test_starcoder2.TestStarcoder2,
    test_olmo2.TestOlmo2,
    test_mamba2.TestMamba2,
    test_smollm3.TestSmolLM3,
    test_lfm2.TestLfm2,
    test_granite_hybrid.TestGraniteHybrid,
    test_jamba.TestJamba,
    test_deepseek2.TestDeepseek2,
    test_quant_types.TestQuantTypes,
)


def test_every_reference_is_checked_once() -> None:
    names = [n for family in FAMILIES for n in family.names]
    assert sorted(names) == sorted(c.REFERENCES)
    assert {c.reference(n).fixture for n in names} == set(ALL_FIXTURES)


def test_every_fixture_holds_every_weight_format() -> None:
    want = {f.name for f in FORMATS}
    for name in c.REFERENCES:
        if c.reference(name).fixture not in FIXTURES:
            continue
        z = np.load(c.HERE / "reference" / f"{name}.npz")
        # A fixture whose experts ship in one type (gpt-oss: MXFP4) holds
        # that type besides the 13.
        experts = FIXTURES[c.reference(name).fixture].experts_type
        extra = {experts.name} if experts is not None else set()
        assert set(z["tensor_formats"].tolist()) == want | extra, name


def test_every_new_type_has_a_fixture_all_in_it() -> None:
    """Every matrix, token embedding and output included, in the type (the
    MoE fixture: every expert); whatever is not a matrix stays F32."""
    covered = set()
    for name, fx in TYPE_FIXTURES.items():
        z = np.load(c.HERE / "reference" / f"{name}.npz")
        formats = dict(zip(z["tensor_names"].tolist(), z["tensor_formats"].tolist(), strict=True))
        assert fx.weight_type is not None
        want = fx.weight_type.name
        for tensor, fmt in formats.items():
            if fx.experts_only:
                assert fmt == want if "_exps." in tensor else fmt in ("Q8_0", "F32"), tensor
            else:
                assert fmt in (want, "F32"), (name, tensor, fmt)
        if not fx.experts_only:
            assert formats["token_embd.weight"] == want
            assert formats["output.weight"] == want
        covered.add(want)
    assert covered == {t.name for t in NEW_TYPES}
