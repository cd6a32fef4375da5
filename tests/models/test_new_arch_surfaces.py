"""The smollm3, gpt-oss, jamba, gemma3n and deepseek2 fixtures beyond the logits: ``oxillama info``
names them as llama.cpp does (its description, size and parameter count,
recorded in reference/meta.json by make_fixtures.py), and the HTTP server
generates with them what a lone Engine generates, streamed or not, past
gpt-oss's sliding window."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from oxillama import AsyncEngine
from oxillama.cli.main import main
from tests._serve import serving
from tests.models import _checks as c

META = json.loads((c.HERE / "reference" / "meta.json").read_text())["fixtures"]
NAMES = ("smollm3", "gpt-oss", "jamba", "gemma3n", "deepseek2", "deepseek2_lite")
# Longer than gpt-oss's window of 8 with the prompt, so its local layers
# drop keys while the server generates.
N_TOKENS = 16


def info(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["info", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_info_names_the_model_as_llama_cpp(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    ref = c.reference(name)
    theirs = META[name]["llama_cpp_model"]
    doc = json.loads(info(capsys, str(ref.path), "--json"))
    assert doc["model"]["description"] == theirs["desc"]
    assert doc["model"]["n_bytes"] == theirs["size"]
    assert doc["model"]["n_params"] == theirs["n_params"]
    arch = META[name]["arch"]
    assert doc["hparams"]["n_layer"] == META[name]["metadata"][f"{arch}.block_count"]
    text = info(capsys, str(ref.path))
    assert f"architecture:  {arch}\n" in text
    window = META[name]["metadata"].get(f"{arch}.attention.sliding_window")
    if window is not None:
        assert f"sliding window  {window}\n" in text


def _post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data: bytes = resp.read()
    return data


@pytest.mark.parametrize("name", NAMES)
def test_server_generates_a_lone_engines_text(name: str) -> None:
    ref = c.reference(name)
    prompt = ref.greedy_prompt
    want = c.engine(ref.path, ref).generate(prompt, N_TOKENS, ignore_eos=True).text
    ae = AsyncEngine(ref.path, context_size=ref.n_ctx, threads=c.THREADS)
    body = {
        "model": name,
        "prompt": prompt,
        "max_tokens": N_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }
    with serving(ae, name) as url:
        whole = json.loads(_post(url + "/v1/completions", body))
        stream = _post(url + "/v1/completions", {**body, "stream": True}).decode()
    assert whole["choices"][0]["text"] == want
    assert whole["usage"]["completion_tokens"] == N_TOKENS
    chunks = [
        json.loads(line[len("data: ") :])
        for line in stream.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == want
