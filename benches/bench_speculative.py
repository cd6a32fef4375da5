"""Speculative decoding against the target alone, on the pair made by
scripts/make_spec_pair.py (SmolLM2 F16 target, Q4_0 draft), 2 threads.

    python benches/bench_speculative.py [--tokens 128] [--k 4] [--reps 3]

Greedy decode tokens/s (medians) of the target alone, the draft alone, and
speculative decoding with synchronous and with asynchronous drafting; the
ratio to the target (bar 1.5x) and the acceptance rate. Also printed: the
ceiling the pair allows whatever the acceptance, (k + 1) / (k c + 1) with
c the draft's cost per token relative to the target's (a round costs k
draft steps and at least one target step), and the ceiling at the measured
greedy agreement a per token: max over k of (1 - a^(k+1)) / ((1 - a)(k c + 1)),
i.e. even with verification as cheap as one target step. When
llama-cpp-python is installed, the same agreement is measured with
llama.cpp (teacher-forced argmax of draft vs target along the target's
greedy text), to show it is the pair's, not our kernels'.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

from oxillama import Engine, SamplerConfig
from oxillama.engine.speculative import SpeculativeEngine

PROMPTS = ["Once upon a time", "The history of science", "def quicksort(xs):"]


def llama_cpp_agreement(tpath: str, dpath: str, n_tokens: int) -> float | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    import numpy as np

    kw = {"n_ctx": 512, "logits_all": True, "verbose": False, "n_threads": 2}
    t = llama_cpp.Llama(str(tpath), **kw)
    d = llama_cpp.Llama(str(dpath), **kw)
    same = total = 0
    for p in PROMPTS:
        prompt = t.tokenize(p.encode(), add_bos=True)
        seq = list(prompt)
        for tok in t.generate(prompt, temp=0.0, reset=True):
            seq.append(tok)
            if len(seq) >= len(prompt) + n_tokens:
                break
        rows = []
        for m in (t, d):
            m.reset()
            m.eval(seq)
            rows.append(np.asarray(m.scores[len(prompt) - 1 : len(seq) - 1]).argmax(axis=1))
        same += int((rows[0] == rows[1]).sum())
        total += rows[0].size
    return same / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("pair", root / "scripts/make_spec_pair.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tpath, dpath = mod.make_pair(Path.home() / ".cache/oxillama/spec")
    target = Engine(tpath, context_size=1024, threads=2)
    draft = Engine(dpath, context_size=1024, threads=2)
    engines = {
        "sync": SpeculativeEngine(target, draft, num_speculative=args.k),
        "async": SpeculativeEngine(target, draft, num_speculative=args.k, async_draft=True),
    }
    g = SamplerConfig.greedy()
    rates: dict[str, list[float]] = {"target": [], "draft": [], "sync": [], "async": []}
    acc: dict[str, list[float]] = {"sync": [], "async": []}
    agree: list[float] = []
    for _ in range(args.reps):
        for p in PROMPTS:
            want: list[int] = []
            for name, eng in (("target", target), ("draft", draft)):
                eng.reset()
                c = eng.generate(p, args.tokens, sampler=g, ignore_eos=True)
                rates[name].append(c.decode_tokens_per_second)
                if name == "target":
                    want = c.tokens
            for name, se in engines.items():
                se.reset()
                c = se.generate(p, args.tokens, sampler=g, ignore_eos=True)
                rates[name].append(c.decode_tokens_per_second)
                acc[name].append(se.stats.acceptance_rate)
                st = se.stats
                if name == "sync" and st.accepted + st.rejected:
                    # Greedy: each round accepts a run of agreements and ends
                    # at the first disagreement (if any).
                    agree.append(st.accepted / (st.accepted + st.rejected))
                assert c.tokens == want, name
    m = {k: statistics.median(v) for k, v in rates.items()}
    cost = m["target"] / m["draft"]
    k = args.k
    print(f"target alone {m['target']:.1f} tok/s, draft alone {m['draft']:.1f} tok/s")
    for name in engines:
        print(
            f"speculative {name} (k={k}) {m[name]:.1f} tok/s: {m[name] / m['target']:.2f}x "
            f"(bar 1.5x), acceptance {statistics.median(acc[name]):.2f}"
        )
    print(
        f"draft cost per token {cost:.2f} of the target's: ceiling at full acceptance "
        f"(k+1)/(k*c+1) = {(k + 1) / (k * cost + 1):.2f}x"
    )
    a = statistics.median(agree)
    best = max(((1 - a ** (j + 1)) / ((1 - a) * (j * cost + 1)), j) for j in range(1, 17))
    print(
        f"greedy agreement per token {a:.2f}: ceiling {best[0]:.2f}x (at k={best[1]}) "
        "even if verifying cost one target step"
    )
    ref = llama_cpp_agreement(tpath, dpath, args.tokens)
    if ref is not None:
        print(f"llama.cpp, same pair: greedy agreement per token {ref:.2f}")


if __name__ == "__main__":
    main()
