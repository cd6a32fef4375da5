"""`oxillama quantize` from the command line, its refusals (typed, named,
before any output), split inputs, and the importance-matrix readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oxillama import LoadError, ParameterError
from oxillama import quantize as quantize_fn
from oxillama.cli.main import main
from oxillama.model.quantize.ftypes import row_bytes
from oxillama.model.quantize.gguf_io import I32, U16, encode_kv, header_bytes, pad, read_layout
from oxillama.model.quantize.imatrix import load_imatrix
from tests._quant_cases import REFS, _imatrix_values, build_input, file_digest, write_imatrix

REFERENCE = {c["id"]: c for c in json.loads(REFS.read_text())["cases"]}


@pytest.fixture(scope="module")
def llama8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_input(["llama", 8, "f16"], tmp_path_factory.mktemp("cli"))


def test_positional_form_with_threads_and_progress(
    llama8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.gguf"
    assert main(["quantize", str(llama8), str(out), "q8_0", "2"]) == 0
    assert file_digest(out) == REFERENCE["llama-q8_0"]["file_sha256"]
    cap = capsys.readouterr()
    assert str(out) in cap.out
    assert "quantize" in cap.err and "Q8_0: 76 tensors" in cap.err  # bar and summary


def test_default_output_name_beside_input(llama8: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.gguf"
    src.write_bytes(llama8.read_bytes())
    assert main(["quantize", "-q", str(src), "Q6_K"]) == 0
    assert file_digest(tmp_path / "ggml-model-Q6_K.gguf") == REFERENCE["llama-q6_k"]["file_sha256"]


@pytest.mark.parametrize(
    ("flags", "tail", "match"),
    [
        ([], ["Q9_K"], "unknown quantization type 'Q9_K'"),
        ([], ["IQ2_XXS"], "IQ2_XXS needs an importance matrix"),
        ([], ["Q2_K_S"], "Q2_K_S needs an importance matrix"),
        ([], ["Q4_K_M", "0"], "NTHREADS must be a positive integer"),
        (["--output-tensor-type", "Q7_0"], ["Q4_K_M"], "unknown --output-tensor-type 'Q7_0'"),
    ],
)
def test_refusals_name_the_problem_before_any_output(
    llama8: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    tail: list[str],
    match: str,
) -> None:
    out = tmp_path / "o.gguf"
    assert main(["quantize", *flags, str(llama8), str(out), *tail]) == 2
    assert match in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_type_we_do_not_write_is_refused_by_name(
    llama8: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every type a mix can choose is written today; a native module without
    # one of them (an older build) must still refuse it up front.
    from oxillama.model.quantize import run

    monkeypatch.setattr(run, "writes_type", lambda name: name != "IQ2_XXS")
    imatrix = write_imatrix("gguf", llama8, tmp_path / "imatrix.gguf")
    with pytest.raises(ParameterError, match="does not write IQ2_XXS"):
        quantize_fn(llama8, tmp_path / "o.gguf", "IQ2_XXS", imatrix=imatrix, progress=False)
    assert not (tmp_path / "o.gguf").exists()


def test_iq3_xxs_without_an_imatrix_is_refused_as_llama_cpp_does(
    llama8: Path, tmp_path: Path
) -> None:
    # The IQ3_XXS mix puts attn_k in IQ2_S, which needs one.
    with pytest.raises(
        ParameterError, match=r"blk\.0\.attn_k\.weight would be IQ2_S, which needs an importance"
    ):
        quantize_fn(llama8, tmp_path / "o.gguf", "IQ3_XXS", progress=False)
    assert not (tmp_path / "o.gguf").exists()


def test_requantizing_needs_the_flag() -> None:
    src = build_input(["llama", 0, "as-is"], Path("."))
    with pytest.raises(
        ParameterError, match=r"output\.weight is already Q5_1: requantizing is refused"
    ):
        quantize_fn(src, Path("never-written.gguf"), "Q4_K_M", progress=False)
    assert not Path("never-written.gguf").exists()


def test_output_over_input_is_refused(llama8: Path, tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(llama8.read_bytes())
    with pytest.raises(ParameterError, match="is the input"):
        quantize_fn(src, tmp_path / "." / "m.gguf", "Q8_0", progress=False)
    assert src.read_bytes() == llama8.read_bytes()


def test_missing_input_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="cannot open"):
        quantize_fn(tmp_path / "none.gguf", tmp_path / "o.gguf", "Q8_0", progress=False)


def _split(src: Path, folder: Path) -> Path:
    """`src` cut in two parts as gguf-split writes them."""
    lay = read_layout(src)
    names = [t.name for t in lay.tensors]
    half = len(names) // 2
    for i, part in enumerate((lay.tensors[:half], lay.tensors[half:])):
        kv = list(lay.raw_kv) if i == 0 else []
        kv += [
            ("split.no", encode_kv("split.no", U16, i)),
            ("split.count", encode_kv("split.count", U16, 2)),
            ("split.tensors.count", encode_kv("split.tensors.count", I32, len(names))),
        ]
        infos, datas, off = [], [], 0
        for t in part:
            data = bytes(
                lay.tensor_bytes(t, row_bytes(t.type_id, t.shape[0]) * (t.n_elements // t.shape[0]))
            )
            infos.append((t.name, t.shape, t.type_id, off))
            datas.append(data)
            off += pad(len(data), 32)
        with open(folder / f"split-{i + 1:05d}-of-00002.gguf", "wb") as f:
            f.write(header_bytes(kv, infos, 32))
            for d in datas:
                f.write(d + bytes(pad(len(d), 32) - len(d)))
    lay.close()
    return folder / "split-00001-of-00002.gguf"


def test_split_input_joined_or_kept(llama8: Path, tmp_path: Path) -> None:
    first = _split(llama8, tmp_path)
    joined = tmp_path / "joined.gguf"
    quantize_fn(first, joined, "Q8_0", progress=False)
    assert file_digest(joined) == REFERENCE["llama-q8_0"]["file_sha256"]

    result = quantize_fn(first, tmp_path / "kept.gguf", "Q8_0", keep_split=True, progress=False)
    assert [p.name for p in result.outputs] == [
        "kept-00001-of-00002.gguf",
        "kept-00002-of-00002.gguf",
    ]
    parts = [read_layout(p) for p in result.outputs]
    assert [p.values["split.no"] for p in parts] == [0, 1]
    assert all(p.values["split.count"] == 2 for p in parts)
    assert parts[0].values["general.file_type"] == 7 and "general.file_type" not in parts[1].values
    assert sum(len(p.tensors) for p in parts) == len(result.tensors) == 76


def test_keep_split_of_a_single_file(llama8: Path, tmp_path: Path) -> None:
    result = quantize_fn(llama8, tmp_path / "one.gguf", "Q8_0", keep_split=True, progress=False)
    assert result.outputs == [tmp_path / "one-00001-of-00001.gguf"]
    # The same file as llama.cpp's (tensors in file order, as it sorts them
    # with --keep-split; it names the file OUT.gguf-00001-of-00001.gguf).
    assert file_digest(result.outputs[0]) == REFERENCE["llama-q8_0-keep-split"]["file_sha256"]


@pytest.mark.parametrize("kind", ["gguf", "dat"])
def test_imatrix_readers(llama8: Path, tmp_path: Path, kind: str) -> None:
    path = write_imatrix(kind, llama8, tmp_path / f"m.{kind}")
    got = load_imatrix(path)
    want = _imatrix_values(llama8)
    assert set(got) == set(want)
    for name, (sums, counts, ne0) in want.items():
        if kind == "dat":
            expect = sums / np.float32(int(counts[0]))
        else:
            expect = np.concatenate(
                [sums[j * ne0 : (j + 1) * ne0] / counts[j] for j in range(counts.size)]
            )
        np.testing.assert_array_equal(got[name], expect.astype(np.float32))


def test_imatrix_with_a_non_finite_value_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "bad.dat"
    name = b"blk.0.attn_q.weight"
    v = np.array([1.0, np.inf], dtype="<f4").tobytes()
    p.write_bytes(
        np.array([1, len(name)], dtype="<i4").tobytes()
        + name
        + np.array([1, 2], dtype="<i4").tobytes()
        + v
    )
    with pytest.raises(LoadError, match="non-finite"):
        load_imatrix(p)
