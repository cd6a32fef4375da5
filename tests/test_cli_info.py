"""``oxillama info`` on SmolLM2 and Gemma-3, checked against llama.cpp:
llama-bench's name, size and parameter count for each file
(reference/llama_bench.json), llama.cpp's special tokens
(reference/vocab_*.json) and the metadata as the ``gguf`` package reads it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import oxillama._native as _native
from oxillama.cli.main import main
from tests._gguf_meta import ModelMissing, gemma3_path, read_metadata, smollm2_path

REF = Path(__file__).parent / "reference"
BENCH = json.loads((REF / "llama_bench.json").read_text("utf-8"))["models"]


def _path(name: str) -> Path:
    try:
        return smollm2_path() if name == "smollm2" else gemma3_path()
    except ModelMissing as e:  # fail, never skip
        pytest.fail(str(e), pytrace=False)


def info(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["info", *args]) == 0
    return capsys.readouterr().out


MODELS = ["smollm2", "gemma3"]


@pytest.mark.parametrize("name", MODELS)
def test_json_model_matches_llama_cpp(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _path(name)
    doc = json.loads(info(capsys, str(path), "--json"))
    ref = BENCH[name]
    model = doc["model"]
    assert model["description"] == ref["model_type"]
    assert model["n_params"] == ref["model_n_params"]
    assert model["n_bytes"] == ref["model_size"]
    # The parameter count is every element of every tensor in the file.
    tensors = _native.GgufFile.open(str(path)).tensors()
    assert len(doc["tensors"]) == len(tensors)
    assert model["n_params"] == sum(math.prod(dims) for _, _, dims, _, _ in tensors)
    assert model["n_params"] == sum(t["n_params"] for t in doc["tensors"])
    assert [t["name"] for t in doc["tensors"]] == [t[0] for t in tensors]
    mix = {m["type"]: m["tensors"] for m in doc["type_mix"]}
    assert sum(mix.values()) == len(tensors)
    meta = read_metadata(path)
    assert doc["model"]["file_type_id"] == meta["general.file_type"]
    assert doc["hparams"]["n_layer"] == meta[f"{model['architecture']}.block_count"]
    # Long arrays are shortened to their length; the rest is the file's.
    assert doc["metadata"]["tokenizer.ggml.tokens"]["array_length"] == len(
        meta["tokenizer.ggml.tokens"]
    )
    assert doc["metadata"]["general.architecture"] == meta["general.architecture"]


@pytest.mark.parametrize("name", MODELS)
def test_text_summary_tokenizer_and_every_tensor(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _path(name)
    out = info(capsys, str(path), "--tensors")
    lines = out.splitlines()
    ref = BENCH[name]
    meta = read_metadata(path)
    arch = meta["general.architecture"]
    assert f"model:         {ref['md_model']}" in out
    assert f"parameters:    {ref['md_params']} ({ref['model_n_params']:,})" in out
    assert f"tensor data:   {ref['md_size']}," in out

    # The tokenizer as llama.cpp reads it (ids, flags, end-of-generation).
    vocab = json.loads((REF / f"vocab_{name}.json").read_text("utf-8"))
    tokens = meta["tokenizer.ggml.tokens"]
    assert (
        f"tokenizer:     {meta['tokenizer.ggml.model']}, pre-tokenizer "
        f"{meta.get('tokenizer.ggml.pre', 'default')}, {vocab['n_vocab']} tokens, "
        f"add_bos {vocab['add_bos']}, add_eos {vocab['add_eos']}"
    ) in lines
    for slot in ("bos", "eos", "eot"):
        i = vocab[slot]
        assert f"  {slot.upper():4s} {i:<7d} {tokens[i]!r}" in lines
    assert "  end of generation: " + ", ".join(map(str, vocab["eog"])) in lines

    # Hyper-parameters from the file.
    n_head_kv = meta[f"{arch}.attention.head_count_kv"]
    assert f"  layers          {meta[f'{arch}.block_count']}" in lines
    assert f"  KV heads        {n_head_kv}" in lines
    head_dim = meta.get(f"{arch}.attention.key_length") or (
        meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"]
    )
    assert f"  head dim        {head_dim}" in lines

    # One table row per tensor, in file order.
    n = len(_native.GgufFile.open(str(path)).tensors())
    assert f"tensors:       {n}" in lines
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "name"]) + 1
    rows = [line.split() for line in lines[start:]]
    assert len(rows) == n
    assert [int(r[0]) for r in rows] == list(range(n))
    names = [t[0] for t in _native.GgufFile.open(str(path)).tensors()]
    assert [r[1] for r in rows] == names


def test_chat_template_whole_and_missing(capsys: pytest.CaptureFixture[str]) -> None:
    smol = _path("smollm2")
    template = read_metadata(smol)["tokenizer.chat_template"]
    out = info(capsys, str(smol))
    assert f"chat template: {len(template)} characters" in out
    assert "  | " + template.splitlines()[1] in out.splitlines()
    assert info(capsys, str(smol), "--template") == template + "\n"

    gemma = _path("gemma3")
    assert "chat template: none" in info(capsys, str(gemma))
    assert main(["info", str(gemma), "--template"]) == 1
    assert "has no chat template 'default'" in capsys.readouterr().err


def test_json_is_strict_and_complete_with_full(capsys: pytest.CaptureFixture[str]) -> None:
    smol = _path("smollm2")
    text = info(capsys, str(smol), "--json", "--full")

    def no_constants(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name}")

    doc = json.loads(text, parse_constant=no_constants)
    meta = read_metadata(smol)
    assert doc["metadata"]["tokenizer.ggml.merges"] == meta["tokenizer.ggml.merges"]
    assert doc["chat_templates"] == {"default": meta["tokenizer.chat_template"]}
    bos = json.loads((REF / "vocab_smollm2.json").read_text("utf-8"))["bos"]
    assert doc["tokenizer"]["special"]["bos"] == {
        "id": bos,
        "text": meta["tokenizer.ggml.tokens"][bos],
    }


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["info", "--help"])
    text = capsys.readouterr().out
    for word in ("--tensors", "--template", "--json", "examples", "chat template"):
        assert word in text


@pytest.mark.parametrize(
    ("fixture", "rows"),
    [
        ("lfm2", ["layer kinds     1 attention, 2 recurrent (0,2)", "short conv      kernel 3"]),
        (
            "granitehybrid",
            [
                "layer kinds     1 attention, 2 recurrent (0,2)",
                "experts         4 (2 used), shared expert 128 wide",
                "ssm             inner 512, state 16, conv kernel 4",
                "rope            none (rope.scaling.finetuned false)",
            ],
        ),
        (
            "jamba",
            [
                "layer kinds     1 attention, 2 recurrent (0,2)",
                "experts         4 (2 used)",
                "ssm             inner 512, state 16, conv kernel 4, time step rank 16 (Mamba-1)",
                "rope            none (Jamba's attention has no positional encoding)",
            ],
        ),
    ],
)
def test_a_hybrid_s_layer_kinds_and_mixers(
    fixture: str, rows: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Which layers attend and which carry a recurrent state, from the
    per-layer KV head counts, and the recurrent mixers' shapes."""
    path = Path(__file__).parent / "models" / "fixtures" / f"{fixture}.gguf"
    out = info(capsys, str(path))
    for row in rows:
        assert f"  {row}\n" in out, out
