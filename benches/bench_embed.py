"""Embedding throughput: oxillama vs llama.cpp (llama-cpp-python) on the
same all-MiniLM-L6-v2 GGUF (scripts/convert_minilm.py, f16), side by side.

256 sentences per call, 2 threads. llama.cpp runs its batch API,
``Llama.embed(list)``, with ``n_ctx = n_batch = n_ubatch`` sized for the
whole batch (so it packs as many sequences per pass as it allows, up to
``llama_max_parallel_sequences``); oxillama runs ``Engine.embed(list)``.
Each repetition runs both in fresh subprocesses, alternating which goes
first; each worker loads its model, warms with one full call (excluded),
then times ``--inner`` calls and reports their median. The figure is the
median over repetitions of sentences per second, and the ratio is
oxillama / llama.cpp from the same run.

  python benches/bench_embed.py [--reps 5] [--inner 3] [--threads 2] [--model X.gguf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cpu import describe as describe_cpu

N_SENTENCES = 256
SUBJECTS = (
    "The old fisherman",
    "A young engineer",
    "Our neighbour's cat",
    "The city council",
    "My favourite teacher",
    "A small startup",
    "The orchestra",
    "An exhausted student",
)
VERBS = (
    "repaired",
    "discussed",
    "painted",
    "ignored",
    "celebrated",
    "measured",
    "described",
    "sold",
)
OBJECTS = (
    "the broken bridge near the harbour",
    "a surprisingly long report about renewable energy",
    "the garden",
    "three new ideas for the summer festival",
)


def sentences() -> list[str]:
    """256 distinct sentences of 6 to 16 words."""
    out = [f"{s} {v} {o}." for s in SUBJECTS for v in VERBS for o in OBJECTS]
    return out[:N_SENTENCES]


def worker(engine: str, model: str, threads: int, inner: int, llama_batch: int) -> dict[str, float]:
    texts = sentences()
    if engine == "oxillama":
        from oxillama import Engine

        e = Engine(model, threads=threads)
        n_tok = sum(len(e.tokenize(t, add_special=True)) for t in texts)

        def run() -> int:
            return len(e.embed(texts))
    else:
        import llama_cpp

        probe = llama_cpp.Llama(model, vocab_only=True, verbose=False)
        n_tok = sum(len(probe.tokenize(t.encode())) for t in texts)
        # Sized for the whole batch unless --llama-batch says otherwise.
        n = llama_batch or 1 << (n_tok - 1).bit_length()
        llm = llama_cpp.Llama(
            model,
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            n_ctx=n,
            n_batch=n,
            n_ubatch=n,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

        def run() -> int:
            return len(llm.embed(texts, normalize=True))

    assert run() == len(texts)  # warm-up, not timed
    rates = []
    for _ in range(inner):
        t0 = time.perf_counter()
        assert run() == len(texts)
        rates.append(len(texts) / (time.perf_counter() - t0))
    return {"sentences_per_s": statistics.median(rates), "tokens": n_tok}


def spawn(engine: str, model: str, threads: int, inner: int, llama_batch: int) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            engine,
            "--model",
            model,
            "--threads",
            str(threads),
            "--inner",
            str(inner),
            "--llama-batch",
            str(llama_batch),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--worker", default=None)
    ap.add_argument(
        "--llama-batch",
        type=int,
        default=0,
        help="llama.cpp's n_ctx = n_batch = n_ubatch (default: the whole batch's tokens, "
        "rounded up to a power of two)",
    )
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, a.threads, a.inner, a.llama_batch)))
        return
    with tempfile.TemporaryDirectory() as d:
        model = a.model
        if model is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from scripts.convert_minilm import convert, default_zip

            model = str(convert(default_zip(), Path(d) / "minilm.gguf"))
        print(f"CPU: {describe_cpu()}")
        print(
            f"model: {Path(model).name}, {N_SENTENCES} sentences, {a.threads} threads, "
            f"llama.cpp n_batch {a.llama_batch or 'sized for the batch'}"
        )
        ours, theirs, ratios = [], [], []
        for rep in range(a.reps):
            order = ("oxillama", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "oxillama")
            got = {e: spawn(e, model, a.threads, a.inner, a.llama_batch) for e in order}
            o, t = got["oxillama"]["sentences_per_s"], got["llama.cpp"]["sentences_per_s"]
            ours.append(o)
            theirs.append(t)
            ratios.append(o / t)
            print(
                f"rep {rep}: oxillama {o:7.1f}/s  llama.cpp {t:7.1f}/s  ratio {o / t:.2f}x"
                f"  ({got['oxillama']['tokens']:.0f} tokens)"
            )
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(
            f"median: oxillama {mo:.1f} sentences/s, llama.cpp {mt:.1f} sentences/s, "
            f"ratio {mo / mt:.2f}x (median of per-rep ratios {statistics.median(ratios):.2f}x; "
            "goal >= 1.5x)"
        )


if __name__ == "__main__":
    main()
