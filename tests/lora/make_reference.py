"""Records llama.cpp's logits with the test adapters (llama-cpp-python
0.3.36; run ``python -m tests.lora.make_reference`` from the repository
root). Writes ``reference/smollm2.npz``, ``reference/fixture.npz`` and
``reference/meta.json`` (the adapters' sha256, so the tests know they
rebuilt the same files). Deterministic on one llama.cpp build.

- SmolLM2 Q4_1 as shipped: teacher-forced ``cases.SMOL_TOKENS`` in one
  batch, full logits at ``cases.SMOL_POSITIONS``: base, adapter A at each
  of ``cases.SCALES``, and A (1.0) stacked with B (0.7) through
  ``llama_set_adapters_lora``.
- The tests/models llama fixture rewritten to F32 (F32 KV cache), with the
  F32 fixture adapter at scales 1.0 and 0.5: every position's logits.
- ``--quant-bases`` (only this, into ``reference/quant_bases.npz``): each
  tests/models one-type fixture (IQ4_NL ... MXFP4) as it is, F32 KV cache,
  base and with its own F32 fixture adapter (embedding and head included)
  at scale 1.0: every position's logits.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from oxillama.model.paths import default_model_path
from tests.models._rewrite import rewrite_f32

from . import cases

OUT = Path(__file__).parent / "reference"
FIXTURE = Path(__file__).parents[1] / "models" / "fixtures" / "llama.gguf"


def run(
    model: str, tokens: list[int], loras: list[tuple[str, float]], *, f32_kv: bool
) -> np.ndarray:
    kw = {"type_k": 0, "type_v": 0} if f32_kv else {}
    llm = llama_cpp.Llama(
        model, n_ctx=256, n_threads=2, n_batch=256, logits_all=True, verbose=False, seed=1234, **kw
    )
    handles = []
    try:
        if loras:
            for path, _ in loras:
                h = llama_cpp.llama_adapter_lora_init(llm._model.model, path.encode())
                assert h, path
                handles.append(h)
            arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(handles))(*handles)
            scales = (ctypes.c_float * len(loras))(*[s for _, s in loras])
            assert llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(handles), scales) == 0
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        # The adapters belong to the model and are freed with it.
        llm.close()


def quant_bases() -> None:
    """llama.cpp's logits on each one-type fixture, with and without an
    adapter; the adapters' sha256 go into meta.json beside the others."""
    from tests.models._archs import TYPE_FIXTURES

    meta = json.loads((OUT / "meta.json").read_text())
    out: dict[str, Any] = {}
    hashes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fx in TYPE_FIXTURES.items():
            if fx.experts_only:
                continue  # expert adapters are refused (test_moe_experts_are_refused)
            base = FIXTURE.with_name(f"{name}.gguf")
            a = Path(tmp) / f"{name}_a.gguf"
            hashes[name] = cases.fixture_adapter(base, a, seed=cases.QUANT_BASE_SEED)
            out[f"{name}_base"] = run(str(base), cases.FIXTURE_TOKENS, [], f32_kv=True)
            out[f"{name}_a"] = run(str(base), cases.FIXTURE_TOKENS, [(str(a), 1.0)], f32_kv=True)
    np.savez_compressed(OUT / "quant_bases.npz", **out)
    meta["quant_base_adapter_sha256"] = hashes
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quant-bases", action="store_true", help="only quant_bases.npz")
    if ap.parse_args().quant_bases:
        quant_bases()
        return
    OUT.mkdir(exist_ok=True)
    base = default_model_path()
    meta: dict[str, object] = {"llama_cpp_python": llama_cpp.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        a, b = t / "smol_a.gguf", t / "smol_b.gguf"
        meta["smol_a_sha256"] = cases.smol_a(base, a)
        meta["smol_b_sha256"] = cases.smol_b(base, b)
        pos = cases.SMOL_POSITIONS
        smol: dict[str, np.ndarray] = {"positions": np.array(pos)}
        full = run(str(base), cases.SMOL_TOKENS, [], f32_kv=False)
        smol["base"] = full[pos]
        for s in cases.SCALES:
            smol[f"a_{s}"] = run(str(base), cases.SMOL_TOKENS, [(str(a), s)], f32_kv=False)[pos]
        smol["a_1.0_b_0.7"] = run(
            str(base), cases.SMOL_TOKENS, [(str(a), 1.0), (str(b), 0.7)], f32_kv=False
        )[pos]
        np.savez_compressed(OUT / "smollm2.npz", **smol)

        f32 = t / "llama_f32.gguf"
        meta["fixture_f32_sha256"] = rewrite_f32(FIXTURE, f32)
        fa = t / "fixture_a.gguf"
        meta["fixture_a_sha256"] = cases.fixture_adapter(f32, fa)
        fix = {"base": run(str(f32), cases.FIXTURE_TOKENS, [], f32_kv=True)}
        for s in cases.SCALES:
            fix[f"a_{s}"] = run(str(f32), cases.FIXTURE_TOKENS, [(str(fa), s)], f32_kv=True)
        np.savez_compressed(OUT / "fixture.npz", **fix)
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    for p in sorted(OUT.iterdir()):
        print(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()[:16])


if __name__ == "__main__":
    main()
