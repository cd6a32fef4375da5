"""Cold start against llama.cpp, each measured in a fresh process:

    python benches/bench_cold_start.py [--reps 7] [--tokens 1024] [--model M]

1. ``Engine(path)`` against ``llama_cpp.Llama(path)`` (n_ctx 2048, 2
   threads): from the call to a ready engine, the package already imported
   (import times are printed beside, not counted).
2. ``Engine.restore(snapshot)`` of ``--tokens`` tokens against
   ``Llama(path)`` plus ``llama_state_load_file`` of the same tokens: a
   fresh process that continues a saved session.
3. In place: ``engine.load_snapshot(snapshot)`` into a loaded engine
   against ``llama_state_load_file`` into a loaded context.

The model file is in the page cache for both (each side's first process
warms it, and the runs alternate). Medians of ``--reps`` processes per
figure, and the ratios from the same run. Bar (issue 18): each of ours at
or below llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _cpu import describe as describe_cpu

TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "Early machines were programmed by rewiring their circuits; later, stored programs "
    "let the same hardware run many different tasks. "
)
N_CTX = 2048
THREADS = 2

# Each child prints one JSON object of seconds.
OURS = """
import json, sys, time
t = time.perf_counter()
import oxillama
imp = time.perf_counter() - t
model, snap, mode = sys.argv[1:4]
if mode == "engine":
    t = time.perf_counter()
    e = oxillama.Engine(model, context_size={n_ctx}, threads={threads})
    load = time.perf_counter() - t
    t = time.perf_counter()
    e.load_snapshot(snap)
    inplace = time.perf_counter() - t
    assert e.n_past > 0
    print(json.dumps({{"import": imp, "engine": load, "inplace": inplace}}))
else:
    t = time.perf_counter()
    e = oxillama.Engine.restore(snap, threads={threads})
    rst = time.perf_counter() - t
    assert e.n_past > 0
    print(json.dumps({{"import": imp, "restore": rst}}))
"""

THEIRS = """
import ctypes, json, sys, time
t = time.perf_counter()
import llama_cpp
imp = time.perf_counter() - t
model, state, mode, n = sys.argv[1], sys.argv[2].encode(), sys.argv[3], int(sys.argv[4])
buf = (llama_cpp.llama_token * {n_ctx})()
n_out = ctypes.c_size_t(0)
t = time.perf_counter()
llm = llama_cpp.Llama(model, n_ctx={n_ctx}, n_threads={threads}, n_batch=512, verbose=False)
load = time.perf_counter() - t
t = time.perf_counter()
ok = llama_cpp.llama_state_load_file(llm._ctx.ctx, state, buf, {n_ctx}, ctypes.byref(n_out))
inplace = time.perf_counter() - t
assert ok and n_out.value == n, "llama_state_load_file failed"
key = "engine" if mode == "engine" else "restore"
out = {{"import": imp, key: load if key == "engine" else load + inplace}}
if mode == "engine":
    out["inplace"] = inplace
print(json.dumps(out))
"""


def child(code: str, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def prepare(model: str, n_tokens: int, folder: Path) -> tuple[Path, Path]:
    """One OXISNAP1 and one llama.cpp state file of the same tokens."""
    import llama_cpp

    from oxillama import Engine

    e = Engine(model, context_size=N_CTX, threads=THREADS)
    ids = e.tokenize(TEXT * 64)[:n_tokens]
    e.generate(ids, 0)
    assert e.n_past == n_tokens
    snap = folder / "session.oxisnap"
    e.snapshot(snap)
    llm = llama_cpp.Llama(model, n_ctx=N_CTX, n_threads=THREADS, n_batch=512, verbose=False)
    llm.eval(ids)
    state = folder / "session.llama-state"
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    ok = llama_cpp.llama_state_save_file(llm._ctx.ctx, str(state).encode(), arr, len(ids))
    assert ok, "llama_state_save_file failed"
    del llm
    return snap, state


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=7, help="fresh processes per figure")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens in the saved session")
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    a = ap.parse_args()
    from oxillama.model.paths import default_model_path

    model = a.model or str(default_model_path())
    print(f"CPU: {describe_cpu()}\nmodel: {model}\n{a.reps} fresh processes per figure")
    ours_code = OURS.format(n_ctx=N_CTX, threads=THREADS)
    theirs_code = THEIRS.format(n_ctx=N_CTX, threads=THREADS)
    runs: dict[str, dict[str, list[float]]] = {"ours": {}, "llama.cpp": {}}
    with tempfile.TemporaryDirectory(prefix="oxillama-cold-") as tmp:
        snap, state = prepare(model, a.tokens, Path(tmp))
        jobs = {
            "ours": [(ours_code, model, str(snap), m) for m in ("engine", "restore")],
            "llama.cpp": [
                (theirs_code, model, str(state), m, str(a.tokens)) for m in ("engine", "restore")
            ],
        }
        # One untimed round warms the page cache and both packages' files.
        for side in jobs:
            for job in jobs[side]:
                child(*job)
        for r in range(a.reps):
            order = ["ours", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "ours"]
            for side in order:
                for job in jobs[side]:
                    for k, v in child(*job).items():
                        runs[side].setdefault(k, []).append(v)

    def med(side: str, key: str) -> float:
        return statistics.median(runs[side][key]) * 1e3

    rows = [
        ("Engine(path) / Llama(path)", "engine"),
        ("restore in a fresh process", "restore"),
        ("in place: load_snapshot / llama_state_load_file", "inplace"),
        ("import oxillama / import llama_cpp", "import"),
    ]
    print(f"\n{'':50} {'ours ms':>9} {'llama.cpp ms':>13} {'ratio':>7}")
    for label, key in rows:
        ours, theirs = med("ours", key), med("llama.cpp", key)
        bar = "" if key == "import" else ("  PASS" if ours <= theirs else "  OVER")
        print(f"{label:50} {ours:9.1f} {theirs:13.1f} {ours / theirs:6.2f}x{bar}")
    print("(ratio = ours / llama.cpp; the bar is <= 1.00x on the first three rows)")


if __name__ == "__main__":
    main()
