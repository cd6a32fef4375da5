"""The i-quants, the ternary types and MXFP4 wherever the other weight
types load: the shared weight arena (and with it switched off, and with
repacking off), the layer pager (offload), and a tensor type we still do
not run refused at load, naming the tensor and its type id. Each on the
tests/models one-type fixtures (every matrix, token embedding and output
included, in the type; qwen3moe-mxfp4's experts in MXFP4); their logits
against llama.cpp, LoRA and ``info`` are tested beside them
(tests/models/test_quant_types.py, test_lora.py, test_quant_info.py)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from oxillama import Budget, Engine, LoadError, Model, SamplerConfig
from oxillama._native import GgufFile
from tests.models._archs import TYPE_FIXTURES

FIXTURES = Path(__file__).parent / "models" / "fixtures"
PATHS = {name: FIXTURES / f"{name}.gguf" for name in TYPE_FIXTURES}
TOKENS = [302, 17, 88, 203, 45, 12, 260, 301, 7, 99, 150, 3]

# One fresh process per setting (the switches are read once per process):
# each fixture's logits for a prompt and one more token, and the bytes of
# the arena files mapped while it was alive.
PROBE = """
import gc, hashlib, json, os, sys
import numpy as np
from oxillama import _native

def arena_bytes():
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                inside = os.environ["OXILLAMA_ARENA_DIR"] in line
            elif inside and parts[0] == "Rss:":
                total += int(parts[1]) * 1024
    return total

out = {}
for path in sys.argv[2:]:
    m = _native.Model(_native.GgufFile.open(path))
    s = _native.Session(m, 64, 1)
    tokens = json.loads(sys.argv[1])
    a = np.asarray(s.eval(np.array(tokens, dtype=np.uint32)), dtype=np.float32)
    b = np.asarray(s.eval(np.array([5], dtype=np.uint32)), dtype=np.float32)
    out[path] = {"digest": hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest(),
                 "arena": arena_bytes()}
    del s, m
    gc.collect()
print(json.dumps(out))
"""


def probe(arena_dir: Path, **switches: str) -> dict[str, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OXILLAMA_")}
    env = {**env, "OXILLAMA_ARENA_DIR": str(arena_dir), **switches}
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(TOKENS), *map(str, PATHS.values())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, dict[str, object]] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def matrix_bytes(path: Path) -> int:
    return sum(t[4] for t in GgufFile.open(str(path)).tensors() if len(t[2]) >= 2)


def test_the_shared_arena_holds_every_new_type_and_the_bits_stay(tmp_path: Path) -> None:
    shared = probe(tmp_path)
    private = probe(tmp_path, OXILLAMA_SHARE_WEIGHTS="0")
    kept = probe(tmp_path, OXILLAMA_REPACK="0")
    for name, path in PATHS.items():
        key = str(path)
        assert shared[key]["digest"] == private[key]["digest"] == kept[key]["digest"], name
        # An arena file is mapped and resident for each (its 2 MiB pieces
        # make it larger than these tiny models' matrices); with sharing or
        # repacking off, none is.
        arena = shared[key]["arena"]
        assert isinstance(arena, int) and arena > 0.5 * matrix_bytes(path), (name, arena)
        assert private[key]["arena"] == kept[key]["arena"] == 0, name
    # The last process to let go of each arena removed its file.
    assert list(tmp_path.iterdir()) == []


def run(model: Model) -> tuple[np.ndarray, list[int]]:
    e = Engine(model, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    logits = e.eval(TOKENS, all_logits=True)
    return logits, e.generate("", 4, ignore_eos=True).tokens


@pytest.mark.parametrize("name", list(PATHS))
def test_offload_gives_the_plain_mapping_s_bits(name: str) -> None:
    path = PATHS[name]
    model = Model(path)
    want_logits, want_tokens = run(model)
    w = sum(t[4] for t in GgufFile.open(str(path)).tensors())
    # Two layers: half the file holds one layer at a time, so each pass
    # pages both in and out.
    model.set_offload(Budget(w // 2))
    logits, tokens = run(model)
    assert tokens == want_tokens
    assert logits.tobytes() == want_logits.tobytes()
    m = Engine(model).metrics()
    assert m["offload_layer_loads"] > 0 and m["offload_bytes_read"] > 0
    assert 0 < m["offload_peak_resident_bytes"] <= w // 2
    assert m["offload_evictions"] > 0


def with_type_id(src: Path, dst: Path, tensor: str, type_id: int) -> None:
    """``src`` with ``tensor``'s type id in the header replaced, its data
    untouched: a type we do not know, whatever its block size."""
    data = bytearray(src.read_bytes())
    r = gguf.GGUFReader(str(src))
    t = next(t for t in r.tensors if t.name == tensor)
    name = tensor.encode()
    # Tensor info: u64 name length, name, u32 n_dims, u64 dims, u32 type.
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    at += 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, at)[0] == int(t.tensor_type)
    struct.pack_into("<I", data, at, type_id)
    dst.write_bytes(bytes(data))


# ggml's NVFP4 and Q1_0, which we do not run yet, and an id nothing uses.
@pytest.mark.parametrize("type_id", [40, 41, 99])
def test_a_type_we_do_not_run_is_a_load_error_naming_it(type_id: int, tmp_path: Path) -> None:
    dst = tmp_path / "unknown.gguf"
    with_type_id(PATHS["iq4_xs"], dst, "blk.1.ffn_up.weight", type_id)
    with pytest.raises(LoadError, match=rf"blk\.1\.ffn_up\.weight .*type id {type_id}\b"):
        Engine(dst, context_size=64, threads=2)
