"""Snapshot save/restore, oxillama (OXISNAP1) against llama.cpp's
llama_state_save_file / llama_state_load_file, on the same 1,024 tokens.

    python benches/bench_snapshot.py [--model M] [--tokens 1024] [--reps 5]

Both engines use an f16 KV cache. Reported (medians): save time, restore
time excluding the model load, file size, re-prefill time of the same tokens
(what a restore saves), and oxillama's total Engine.restore time including
the model load next to llama.cpp's model load. Our save is atomic (temp file,
fsync, rename); llama.cpp writes in place without fsync, so the comparison
favours it. Needs `pip install llama-cpp-python`.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time
from pathlib import Path

TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "Early machines were programmed by rewiring their circuits; later, stored programs "
    "let the same hardware run many different tasks. "
)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def bench_llama_cpp(model: str, tokens: list[int], reps: int, folder: Path) -> dict[str, float]:
    import llama_cpp

    out: dict[str, list[float]] = {"save": [], "load": [], "prefill": [], "model_load": []}
    size = 0
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    for r in range(reps):
        llm = llama_cpp.Llama(model, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
        t = time.perf_counter()
        llm.eval(tokens)
        out["prefill"].append(time.perf_counter() - t)
        path = str(folder / f"llama-{r}.state").encode()
        t = time.perf_counter()
        ok = llama_cpp.llama_state_save_file(llm._ctx.ctx, path, arr, len(tokens))
        out["save"].append(time.perf_counter() - t)
        assert ok, "llama_state_save_file failed"
        size = os.path.getsize(path)
        del llm
        t = time.perf_counter()
        llm2 = llama_cpp.Llama(model, n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
        out["model_load"].append(time.perf_counter() - t)
        buf = (llama_cpp.llama_token * 4096)()
        n_out = ctypes.c_size_t(0)
        t = time.perf_counter()
        ok = llama_cpp.llama_state_load_file(llm2._ctx.ctx, path, buf, 4096, ctypes.byref(n_out))
        out["load"].append(time.perf_counter() - t)
        assert ok and n_out.value == len(tokens), "llama_state_load_file failed"
        del llm2
    res = {k: med(v) for k, v in out.items()}
    res["size"] = float(size)
    return res


def bench_oxillama(model: str, tokens: list[int], reps: int, folder: Path) -> dict[str, float]:
    from oxillama import Engine
    from oxillama.sessions import _map as snapshot_map
    from oxillama.sessions import sections as S
    from oxillama.sessions import session

    out: dict[str, list[float]] = {
        "save": [],
        "save_no_fsync": [],
        "prefill": [],
        "model_load": [],
        "restore_total": [],
        "load": [],
    }
    size = 0
    for r in range(reps):
        e = Engine(model, context_size=2048, threads=2)
        t = time.perf_counter()
        e.eval(tokens)
        out["prefill"].append(time.perf_counter() - t)
        path = folder / f"oxi-{r}.oxisnap"
        t = time.perf_counter()
        e.snapshot(path)
        out["save"].append(time.perf_counter() - t)
        size = path.stat().st_size
        # The same save at llama.cpp's durability (atomic rename, no fsync).
        t = time.perf_counter()
        e.snapshot(folder / f"oxi-{r}.fast", durable=False)
        out["save_no_fsync"].append(time.perf_counter() - t)
        del e
        t = time.perf_counter()
        fresh = Engine(model, context_size=2048, threads=2)
        out["model_load"].append(time.perf_counter() - t)
        # The state part of a restore, like llama_state_load_file on a
        # loaded model: map the file, verify the checksum, parse, import the
        # KV and the sampler state.
        t = time.perf_counter()
        with open(path, "rb") as f, snapshot_map(f.fileno()) as mm:
            with memoryview(mm) as view:
                meta, secs = session.parse(view)
                fresh._session.import_kv(int(meta["n_past"]), secs[S.KV])
                fresh._sampler.set_state(S.decode_sampler_state(secs[S.SAMPLER_STATE]))
                del meta, secs
        out["load"].append(time.perf_counter() - t)
        assert fresh._session.n_past == len(tokens)
        del fresh
        t = time.perf_counter()
        restored = Engine.restore(path)
        total = time.perf_counter() - t
        out["restore_total"].append(total)
        assert restored.n_past == len(tokens)
        del restored
    res = {k: med(v) for k, v in out.items()}
    res["size"] = float(size)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from oxillama import Engine
    from oxillama.model.paths import default_model_path

    model = str(args.model or default_model_path())
    probe = Engine(model, context_size=64, threads=1)
    tokens = probe.tokenize(TEXT * 64)[: args.tokens]
    assert len(tokens) == args.tokens
    del probe
    # Alternate the two engines rep by rep (each in its own folder), so a
    # drift in the machine's I/O speed hits both alike; medians across reps.
    lls: list[dict[str, float]] = []
    oxs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.reps):
            folder = Path(d) / str(r)
            folder.mkdir()
            lls.append(bench_llama_cpp(model, tokens, 1, folder))
            oxs.append(bench_oxillama(model, tokens, 1, folder))
    ll = {k: med([x[k] for x in lls]) for k in lls[0]}
    ox = {k: med([x[k] for x in oxs]) for k in oxs[0]}
    ms = 1e3
    print(f"model: {model}\ntokens in context: {len(tokens)}, f16 KV, reps {args.reps} (medians)")
    print(f"{'':24}{'llama.cpp':>12}{'oxillama':>12}")
    for label, key, scale, unit in (
        ("save", "save", ms, "ms"),
        ("restore (state only)", "load", ms, "ms"),
        ("file size", "size", 1, "bytes"),
        ("re-prefill", "prefill", ms, "ms"),
        ("model load", "model_load", ms, "ms"),
    ):
        print(f"{label + ' ' + unit:24}{ll[key] * scale:12.1f}{ox[key] * scale:12.1f}")
    print(f"{'save, durable=False ms':24}{'':12}{ox['save_no_fsync'] * ms:12.1f}")
    print(f"{'Engine.restore total ms':24}{'':12}{ox['restore_total'] * ms:12.1f}")
    both_ll = ll["save"] + ll["load"]
    fast, durable = ox["save_no_fsync"] + ox["load"], ox["save"] + ox["load"]
    print(
        f"\nsave+restore at llama.cpp's durability (no fsync): oxillama {fast * ms:.1f} ms vs "
        f"llama.cpp {both_ll * ms:.1f} ms ({'within' if fast <= both_ll else 'OVER'} the bar); "
        f"durable (fsync) {durable * ms:.1f} ms"
    )
    print(f"file size: {ox['size'] / ll['size']:.4f}x llama.cpp's")
    print(f"restore vs re-prefill: {ox['prefill'] / max(ox['load'], 1e-9):.0f}x faster (bar 200x)")


if __name__ == "__main__":
    main()
