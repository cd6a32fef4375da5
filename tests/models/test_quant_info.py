"""``oxillama info`` and ``oxillama bench`` on the one-type fixtures, and
every ``general.file_type``
name, against llama.cpp: its model description, size and parameter count
for each fixture (``reference/meta.json``, ``llama_cpp_model``) and its name
of every file type id (``reference/file_types.json``), both recorded by
make_fixtures.py from llama_model_desc."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from oxillama.cli.main import main
from oxillama.model.summary import summarize
from tests.models._archs import TYPE_FIXTURES
from tests.models._checks import HERE

META = json.loads((HERE / "reference" / "meta.json").read_text())["fixtures"]
FILE_TYPES = {
    int(k): v for k, v in json.loads((HERE / "reference" / "file_types.json").read_text()).items()
}


def info(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["info", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", list(TYPE_FIXTURES))
def test_info_describes_each_new_type_as_llama_cpp(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = HERE / "fixtures" / f"{name}.gguf"
    theirs = META[name]["llama_cpp_model"]
    doc = json.loads(info(capsys, str(path), "--json"))
    model = doc["model"]
    assert model["description"] == theirs["desc"]
    assert model["n_bytes"] == theirs["size"]
    assert model["n_params"] == theirs["n_params"]
    weight_type = TYPE_FIXTURES[name].weight_type
    assert weight_type is not None
    mix = {m["type"]: m["tensors"] for m in doc["type_mix"]}
    assert mix[weight_type.name] > 0
    text = info(capsys, str(path))
    assert f"file type:     {model['file_type']} (general.file_type " in text
    assert theirs["desc"] in text


def test_bench_names_each_new_type_as_llama_bench_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One bench over every fixture: llama-bench's model_type, size and
    parameter count are llama.cpp's (llama_model_desc, _size, _n_params),
    and the markdown table names the type."""
    paths = [str(HERE / "fixtures" / f"{name}.gguf") for name in TYPE_FIXTURES]
    args = ["bench", "-m", ",".join(paths), "-p", "8", "-n", "0", "-r", "1", "-t", "1"]
    assert main([*args, "--no-warmup", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model_filename"] for r in rows] == paths
    for name, row in zip(TYPE_FIXTURES, rows, strict=True):
        theirs = META[name]["llama_cpp_model"]
        assert row["model_type"] == theirs["desc"]
        assert row["model_size"] == theirs["size"]
        assert row["model_n_params"] == theirs["n_params"]
    assert main([*args, "--no-warmup"]) == 0
    table = capsys.readouterr().out
    for name in TYPE_FIXTURES:
        desc = re.escape(META[name]["llama_cpp_model"]["desc"])
        assert re.search(rf"^\| {desc} +\|", table, re.MULTILINE), (name, table)


def test_every_file_type_is_named_as_llama_cpp_names_it() -> None:
    """Every id llama.cpp names, and "unknown, may not work" (llama.cpp's
    words) for ids it does not know."""
    base = summarize(HERE / "fixtures" / "iq4_xs.gguf")
    for ft in range(max(FILE_TYPES) + 3):
        s = dataclasses.replace(base, metadata={**base.metadata, "general.file_type": ft})
        assert s.file_type == FILE_TYPES.get(ft, "unknown, may not work"), ft
    # The mixes that have no one-type fixture, as llama.cpp names them.
    assert (FILE_TYPES[22], FILE_TYPES[27], FILE_TYPES[29]) == (
        "IQ3_XS - 3.3 bpw",
        "IQ3_S mix - 3.66 bpw",
        "IQ2_M - 2.7 bpw",
    )
