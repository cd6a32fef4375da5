"""Checks that each gpt-oss feature of the fixture moves llama.cpp's logits:
each is switched off (a metadata override, or its tensors rewritten in a
copy) and the teacher-forced logits compared with the committed reference.

    python -m tests.models.gpt_oss_bites

Needs llama-cpp-python (0.3.36 made the numbers in README.md). The clamped
SwiGLU has no switch in llama.cpp; the fixture's gate and up projections
have a standard deviation of 4, so the limit of 7 cuts some of them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.models import make_fixtures as mf

NAME = "gpt-oss"


def logits(path: Path, overrides: dict[str, Any] | None = None) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(
        str(path),
        n_ctx=256,
        n_batch=mf.SEQ_LEN,
        n_ubatch=mf.SEQ_LEN,
        n_threads=mf.THREADS,
        logits_all=True,
        flash_attn=False,
        yarn_attn_factor=-1.0,
        yarn_beta_fast=-1.0,
        yarn_beta_slow=-1.0,
        kv_overrides=overrides,
        verbose=False,
    )
    tokens = mf.test_tokens()
    llm.eval(tokens)
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    del llm
    return out


def rewritten(tmp: Path, src: Path, match: Callable[[str], bool], value: float) -> Path:
    """A copy of ``src`` whose F32 tensors named by ``match`` hold ``value``."""
    dst = tmp / "rewritten.gguf"
    shutil.copy(src, dst)
    r = gguf.GGUFReader(dst, "r+")
    hit = [t for t in r.tensors if match(t.name)]
    assert hit, "no tensor matched"
    for t in hit:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        t.data[...] = value
    r.data.flush()
    del r
    return dst


def main() -> None:
    src = mf.fixture_path(NAME)
    ref = np.load(mf.REF_DIR / f"{NAME}.npz")["logits_batched"]
    k = f"{NAME}."
    switches: list[tuple[str, dict[str, Any] | None, Callable[[str], bool] | None, float]] = [
        ("sliding window off (1024)", {k + "attention.sliding_window": 1024}, None, 0.0),
        ("YaRN off (factor 1)", {k + "rope.scaling.factor": 1.0}, None, 0.0),
        ("sinks at -1e4", None, lambda n: "attn_sinks" in n, -1e4),
        ("q/k/v biases 0", None, lambda n: n.endswith(("_q.bias", "_k.bias", "_v.bias")), 0.0),
        ("output bias 0", None, lambda n: n.endswith("attn_output.bias"), 0.0),
        ("router bias 0", None, lambda n: n.endswith("ffn_gate_inp.bias"), 0.0),
        ("expert biases 0", None, lambda n: "_exps.bias" in n, 0.0),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for what, overrides, match, value in switches:
            path = src if match is None else rewritten(Path(tmp), src, match, value)
            out = logits(path, overrides)
            moved = float(np.abs(out - ref).max())
            changed = float((out.argmax(-1) != ref.argmax(-1)).mean())
            print(f"{what}: logits move by up to {moved:.1f}, argmax changes at {changed:.0%}")


if __name__ == "__main__":
    main()
