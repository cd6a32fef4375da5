"""Where the weights live after the first pass (``model/forward.rs``,
``pack_weights``): by default every matrix a decode step streams moves into
memory of the process's own (repacked, or copied onto huge pages), and
``OXILLAMA_REPACK=0`` keeps all of them in the file's pages, the page cache
that processes on one model file share. Either way the logits are the same
bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from oxillama import _native

# Runs in a fresh process: the switch is read once per process.
PROBE = """
import hashlib, json, sys
import numpy as np
from oxillama import _native

def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon")

f = _native.GgufFile.open(sys.argv[1])
before = anon()
m = _native.Model(f)
s = _native.Session(m, 64, 1)
logits = np.asarray(s.eval(np.array([1, 504, 3458, 282], dtype=np.uint32)), dtype=np.float32)
more = np.asarray(s.eval(np.array([1167], dtype=np.uint32)), dtype=np.float32)
print(json.dumps({
    "grew": anon() - before,
    "digest": hashlib.sha256(logits.tobytes() + more.tobytes()).hexdigest(),
}))
"""


def probe(model_path: str, repack: str | None) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("OXILLAMA_REPACK", None)
    if repack is not None:
        env["OXILLAMA_REPACK"] = repack
    out = subprocess.run(
        [sys.executable, "-c", PROBE, model_path],
        env=env,
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


def test_repack_off_keeps_every_matrix_in_the_file_pages(model_path: Path) -> None:
    weights = matrix_bytes(str(model_path))
    moved = probe(str(model_path), None)
    kept = probe(str(model_path), "0")
    # Default: the matrices (SmolLM2's Q4_1 layers and Q8_0 head, about
    # 100 MB) are held by the process, repacked or copied.
    assert isinstance(moved["grew"], int) and moved["grew"] > 0.6 * weights, (moved, weights)
    # Off: neither repacked nor copied; what grows is the KV cache and the
    # scratch of one 64-token session.
    assert isinstance(kept["grew"], int) and kept["grew"] < 0.2 * weights, (kept, weights)
    assert kept["digest"] == moved["digest"], "the file's layout gave other logits"
