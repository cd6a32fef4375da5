"""Writes ``reference.npz``: llama.cpp's embeddings for the inputs of
``texts.py``, so the tests need no llama.cpp.

    python -m tests.embeddings.make_reference

- SmolLM2 (the default model): ``Llama(embedding=True, pooling_type=...)``
  for last (3), mean (1) and cls (2), and the per-token vectors of pooling
  none (0), reduced here to their element-wise max; all normalized to unit
  length, float16 (cosines stay ~1e-4 from float32).
- MiniLM (``scripts/convert_minilm.py``, f16): mean pooling (the file's
  own), normalized, float16, and the token ids llama.cpp used.

Settings: 2 threads, n_ctx 512, n_batch = n_ubatch = 512, f16 KV cache.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from oxillama.model.paths import default_model_path
from scripts.convert_minilm import convert, default_zip

from .texts import DECODER_TEXTS, SENTENCES

HERE = Path(__file__).resolve().parent

POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}


def _llama(path: Path, pooling: int) -> object:
    import llama_cpp

    return llama_cpp.Llama(
        str(path),
        embedding=True,
        pooling_type=pooling,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        n_threads=2,
        verbose=False,
    )


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def main() -> None:
    import llama_cpp

    out: dict[str, np.ndarray] = {}
    smol = default_model_path()
    for mode in ("last", "mean", "cls"):
        m = _llama(smol, POOLING[mode])
        vecs = [m.embed(t, normalize=False) for t in DECODER_TEXTS]  # type: ignore[attr-defined]
        out[f"smollm2_{mode}"] = _unit(np.array(vecs)).astype(np.float16)
    m = _llama(smol, POOLING["none"])
    maxes = []
    for t in DECODER_TEXTS:
        per_token = np.array(m.embed(t, normalize=False))  # type: ignore[attr-defined]
        maxes.append(per_token.max(axis=0))
    out["smollm2_max"] = _unit(np.array(maxes)).astype(np.float16)
    smol_ids = [m.tokenize(t.encode(), add_bos=True, special=False) for t in DECODER_TEXTS]  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory() as d:
        gguf = convert(default_zip(), Path(d) / "minilm.gguf")
        m = _llama(gguf, POOLING["mean"])
        vecs = [m.embed(t, normalize=False) for t in SENTENCES]  # type: ignore[attr-defined]
        out["minilm_mean"] = _unit(np.array(vecs)).astype(np.float16)
        ids = [m.tokenize(t.encode(), add_bos=True, special=False) for t in SENTENCES]  # type: ignore[attr-defined]
    np.savez_compressed(HERE / "reference.npz", **out)
    meta = {
        "llama_cpp_python": llama_cpp.__version__,
        "smollm2_token_ids": smol_ids,
        "minilm_token_ids": ids,
    }
    (HERE / "reference.json").write_text(json.dumps(meta) + "\n")
    print({k: v.shape for k, v in out.items()})


if __name__ == "__main__":
    main()
