"""`oxillama.quantize` against llama.cpp's quantizer: for each case of
_quant_cases.py, the same tensors in the same order with the same types
and bytes, and the same file, as llama_model_quantize wrote
(tests/reference/quantize_refs.json, recorded by
scripts/make_quantize_refs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oxillama.model.quantize import quantize
from oxillama.model.quantize.ftypes import BLOCKS, GGML_TYPES
from tests._quant_cases import CASES, REFS, build_input, file_digest, tensor_digests, write_imatrix

REFERENCE = {c["id"]: c for c in json.loads(REFS.read_text())["cases"]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quantize-inputs")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_same_types_and_bytes_as_llama_cpp(
    case: dict[str, Any], inputs: Path, tmp_path: Path
) -> None:
    src = build_input(case["input"], inputs)
    imatrix = None
    if case.get("imatrix"):
        imatrix = write_imatrix(case["imatrix"], src, tmp_path / "imatrix")
    out = tmp_path / "out.gguf"
    if case.get("options", {}).get("keep_split"):
        out = tmp_path / "out-00001-of-00001.gguf"
    result = quantize(
        src,
        tmp_path / "out.gguf",
        case["ftype"],
        threads=2,
        imatrix=imatrix,
        progress=False,
        **case.get("options", {}),
    )
    ref = REFERENCE[case["id"]]
    ours = tensor_digests(out)
    assert [t[:2] for t in ours] == [t[:2] for t in ref["tensors"]], "names, order or types"
    differing = [t[0] for t, r in zip(ours, ref["tensors"], strict=True) if t[2] != r[2]]
    assert differing == [], f"tensor bytes differ from llama.cpp's: {differing}"
    assert file_digest(out) == ref["file_sha256"], "metadata differs from llama.cpp's"
    assert result.outputs == [out]
    types = {t.name: t.type_out for t in result.tensors}
    assert types == {t[0]: t[1] for t in ref["tensors"]}
    for fb in result.fallbacks:  # reported as they happened
        assert types[fb.name] == fb.used
        assert fb.columns % BLOCKS[GGML_TYPES[fb.wanted]][0] != 0
