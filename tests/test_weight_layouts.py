"""Where the weights live after the first pass (``model/forward.rs``,
``pack_weights``): by default every matrix a decode step streams moves into
an arena (repacked, or copied onto huge pages) that is a file the user's
processes running the model all map (``gguf/shared_arena.rs``);
``OXILLAMA_SHARE_WEIGHTS=0`` keeps the arena in the process's own memory,
and ``OXILLAMA_REPACK=0`` keeps all of them in the file's pages. Either way
the logits are the same bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from oxillama import _native

# Runs in a fresh process: the switches are read once per process.
PROBE = """
import hashlib, json, os, sys
import numpy as np
from oxillama import _native

def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon")

def arena():
    # (inode, resident bytes) of each mapping of a file in the arena folder.
    found, cur = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                cur = int(parts[4]) if os.environ["OXILLAMA_ARENA_DIR"] in line else None
            elif cur is not None and parts[0] == "Rss:":
                found[cur] = found.get(cur, 0) + int(parts[1]) * 1024
    return found

f = _native.GgufFile.open(sys.argv[1])
before = anon()
m = _native.Model(f)
s = _native.Session(m, 64, 1)
logits = np.asarray(s.eval(np.array([1, 504, 3458, 282], dtype=np.uint32)), dtype=np.float32)
more = np.asarray(s.eval(np.array([1167], dtype=np.uint32)), dtype=np.float32)
print(json.dumps({
    "grew": anon() - before,
    "arena": sorted(arena().items()),
    "digest": hashlib.sha256(logits.tobytes() + more.tobytes()).hexdigest(),
}), flush=True)
if len(sys.argv) > 2:
    sys.stdin.read()  # held until the test lets go
"""


def _env(arena_dir: Path, **switches: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OXILLAMA_")}
    return {**env, "OXILLAMA_ARENA_DIR": str(arena_dir), **switches}


def probe(model_path: str, arena_dir: Path, **switches: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, model_path],
        env=_env(arena_dir, **switches),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def matrix_bytes(model_path: str) -> int:
    f = _native.GgufFile.open(model_path)
    return sum(nbytes for _, _, dims, _, nbytes in f.tensors() if len(dims) == 2)


def test_the_arena_is_a_shared_file_unless_turned_off_and_the_bits_stay(
    model_path: Path, tmp_path: Path
) -> None:
    weights = matrix_bytes(str(model_path))
    shared = probe(str(model_path), tmp_path)
    private = probe(str(model_path), tmp_path, OXILLAMA_SHARE_WEIGHTS="0")
    kept = probe(str(model_path), tmp_path, OXILLAMA_REPACK="0")
    # Default: the matrices (SmolLM2's Q4_1 layers and Q8_0 head, about
    # 100 MB) are resident in one mapped arena file, not in private memory.
    arena = shared["arena"]
    assert isinstance(arena, list) and len(arena) == 1, shared
    assert arena[0][1] > 0.6 * weights, (shared, weights)
    assert isinstance(shared["grew"], int) and shared["grew"] < 0.2 * weights, shared
    # Sharing off: the process holds them itself, as before the file.
    assert private["arena"] == [], private
    assert isinstance(private["grew"], int) and private["grew"] > 0.6 * weights, private
    # Repacking off: neither repacked nor copied; what grows is the KV
    # cache and the scratch of one 64-token session.
    assert kept["arena"] == [], kept
    assert isinstance(kept["grew"], int) and kept["grew"] < 0.2 * weights, (kept, weights)
    assert shared["digest"] == private["digest"] == kept["digest"]
    # The last process to let go of the arena removed its file.
    assert list(tmp_path.iterdir()) == []


def test_a_second_process_maps_the_first_ones_arena(model_path: Path, tmp_path: Path) -> None:
    first = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(model_path), "hold"],
        env=_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        made = json.loads(first.stdout.readline())
        files = list(tmp_path.iterdir())
        assert len(files) == 1 and files[0].suffix == ".arena", files
        found = probe(str(model_path), tmp_path)
        assert isinstance(made["arena"], list) and isinstance(found["arena"], list)
        # The same inode: one copy of the weights for both processes.
        assert (
            [i for i, _ in found["arena"]]
            == [i for i, _ in made["arena"]]
            == [files[0].stat().st_ino]
        )
        assert found["digest"] == made["digest"]
        assert isinstance(found["grew"], int) and found["grew"] < 0.2 * matrix_bytes(
            str(model_path)
        )
        # The second let go; the first still holds the file.
        assert files[0].exists()
    finally:
        assert first.stdin is not None
        first.stdin.close()
        first.wait(timeout=60)
    assert list(tmp_path.iterdir()) == []
