"""Distance from the exact math: mean KL(float64 oracle || engine) and
argmax agreement over teacher-forced positions of SmolLM2 (or, with
``--model gemma3``, Gemma-3-270M Q4_K_M), for oxillama and llama.cpp on the
same tokens (the oracles are tests/oracle/llama_f64.py and gemma3_f64.py,
float64 forward passes of the weights ``gguf`` dequantizes).

    python benches/bench_fidelity.py [--positions 256] [--model smollm2|gemma3]

Both engines quantize activations to 8 bits before their quantized
products and accumulate in float32, so neither is exact; llama.cpp's
figure is the yardstick for "as faithful as llama.cpp".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from oxillama import Engine
from oxillama.model.paths import default_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests._gguf_meta import gemma3_path
from tests.oracle.gemma3_f64 import Gemma3F64
from tests.oracle.llama_f64 import TEXT, LlamaF64, kl_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    args = ap.parse_args()
    path = default_model_path() if args.model == "smollm2" else gemma3_path()
    ours = Engine(path, context_size=1024, threads=2)
    toks = ours.tokenize(TEXT * 4, add_special=True)[: args.positions]
    model = LlamaF64(path) if args.model == "smollm2" else Gemma3F64(path)
    oracle = model.logits(toks)
    del model
    rows = {"oxillama (batched)": ours.eval(toks, all_logits=True)}
    ours.reset()
    rows["oxillama (token by token)"] = np.stack([ours.eval([t]) for t in toks])
    try:
        from llama_cpp import Llama

        peer = Llama(str(path), n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
        peer.eval(toks)
        rows["llama.cpp (batched)"] = np.array(peer.scores[: len(toks)])
        peer.reset()
        for t in toks:
            peer.eval([t])
        rows["llama.cpp (token by token)"] = np.array(peer.scores[: len(toks)])
    except ImportError:
        print("llama-cpp-python is not installed: its rows are skipped")
    print(f"{path.name}, {len(toks)} teacher-forced positions of the oracle's text")
    print(f"{'engine':<28} {'mean KL':>9} {'max KL':>8} {'argmax agreement':>17}")
    for name, r in rows.items():
        kl = kl_rows(oracle, r)
        agree = float((oracle.argmax(-1) == r.argmax(-1)).mean())
        print(f"{name:<28} {kl.mean():>9.5f} {kl.max():>8.4f} {agree:>17.3f}")


if __name__ == "__main__":
    main()
