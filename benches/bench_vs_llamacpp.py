"""oxillama vs llama.cpp (llama-cpp-python) on the same GGUF, side by side.

Each measurement runs in a fresh subprocess (so peak RSS belongs to one
engine), engines alternate within each repetition, and medians are
reported with the oxillama / llama.cpp ratio. Both engines are warmed the
same way before anything is timed: one full-size prefill and one full decode
run (so neither pays for first-batch allocations or page faults in its
figures), then each worker times ``--inner`` prefills and decodes and reports
their medians.

  python benches/bench_vs_llamacpp.py                      # SmolLM2, 1 and 2 threads
  python benches/bench_vs_llamacpp.py --model gemma.gguf --threads 2 --reps 7

Needs `pip install llama-cpp-python` (builds llama.cpp from source).
pp512: prefill of 512 tokens. tg128: greedy decode of 128 tokens after a
4-token prompt, ignoring EOS. Model load is excluded from both.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from _cpu import describe as describe_cpu

TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "Early machines were programmed by rewiring; later, stored programs let the same "
    "hardware run many tasks. Compilers, operating systems and networks followed, each "
    "hiding complexity behind a simpler interface. "
)


def prompt_tokens(tokenize, n: int) -> list[int]:
    toks: list[int] = []
    while len(toks) < n:
        toks += tokenize(TEXT)
    return toks[:n]


def worker(engine: str, model: str, threads: int, pp: int, tg: int, inner: int) -> dict[str, float]:
    pps: list[float] = []
    tgs: list[float] = []
    if engine == "oxillama":
        from oxillama import Engine, SamplerConfig

        e = Engine(model, threads=threads, context_size=1024, sampler=SamplerConfig.greedy())
        toks = prompt_tokens(lambda s: e.tokenize(s), pp)
        # Round 0 is the warm-up (full prefill, full decode), not reported.
        for r in range(inner + 1):
            e.reset()
            t0 = time.perf_counter()
            e.eval(toks)
            t_pp = time.perf_counter() - t0
            e.reset()
            e.eval(toks[:4])
            t0 = time.perf_counter()
            c = e.generate("", tg, ignore_eos=True)
            t_tg = time.perf_counter() - t0
            assert len(c.tokens) == tg
            if r:
                pps.append(pp / t_pp)
                tgs.append(tg / t_tg)
    else:
        from llama_cpp import Llama

        llm = Llama(
            model,
            n_ctx=1024,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=512,
            n_ubatch=512,
            verbose=False,
        )
        toks = prompt_tokens(lambda s: llm.tokenize(s.encode(), add_bos=False), pp)
        for r in range(inner + 1):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(toks)
            t_pp = time.perf_counter() - t0
            llm.reset()
            llm.eval(toks[:4])
            t0 = time.perf_counter()
            for _ in range(tg):
                tok = llm.sample(top_k=1, temp=0.0)
                llm.eval([tok])
            t_tg = time.perf_counter() - t0
            if r:
                pps.append(pp / t_pp)
                tgs.append(tg / t_tg)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"pp": statistics.median(pps), "tg": statistics.median(tgs), "rss": rss_mib}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--engines", default="oxillama,llama.cpp")
    ap.add_argument("--inner", type=int, default=3, help="timed runs per worker after the warm-up")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from oxillama.model.paths import default_model_path

        args.model = str(default_model_path())
    if args.worker:
        out = worker(args.worker, args.model, int(args.threads), args.pp, args.tg, args.inner)
        print(json.dumps(out))
        return

    engines = args.engines.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    print(f"cpu: {describe_cpu()}")
    print(
        f"model: {args.model}\nreps: {args.reps} x {args.inner} (medians; each worker warmed "
        f"with a full pp{args.pp} and a full tg{args.tg} first), pp{args.pp}, tg{args.tg}"
    )
    header = f"{'threads':>7} {'engine':>10} {'pp tok/s':>10} {'tg tok/s':>10} {'peak RSS MiB':>13}"
    rows: dict[tuple[int, str], list[dict[str, float]]] = {}
    for t in threads:
        for rep in range(args.reps):
            order = engines if rep % 2 == 0 else engines[::-1]
            for eng in order:
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--worker",
                        eng,
                        "--model",
                        args.model,
                        "--threads",
                        str(t),
                        "--pp",
                        str(args.pp),
                        "--tg",
                        str(args.tg),
                        "--inner",
                        str(args.inner),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.setdefault((t, eng), []).append(r)
                # Every repetition, so the spread behind each median shows.
                print(
                    f"rep {rep + 1}/{args.reps}, {t} threads, {eng}: "
                    f"pp {r['pp']:.1f} tok/s, tg {r['tg']:.1f} tok/s",
                    flush=True,
                )
    print(header)
    med: dict[tuple[int, str], dict[str, float]] = {}
    for (t, eng), rs in sorted(rows.items()):
        m = {k: statistics.median(r[k] for r in rs) for k in ("pp", "tg", "rss")}
        med[(t, eng)] = m
        print(f"{t:>7} {eng:>10} {m['pp']:>10.1f} {m['tg']:>10.1f} {m['rss']:>13.1f}")
    if len(engines) == 2:
        a, b = engines
        print(f"\nratios {a} / {b} (>1 means {a} is faster; RSS difference in MiB)")
        for t in threads:
            x, y = med[(t, a)], med[(t, b)]
            print(
                f"  threads={t}: pp {x['pp'] / y['pp']:.2f}x  tg {x['tg'] / y['tg']:.2f}x  "
                f"RSS {x['rss'] - y['rss']:+.1f} MiB"
            )


if __name__ == "__main__":
    main()
