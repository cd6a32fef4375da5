"""Decode speed and bytes read per token under a memory budget
(``Engine(..., offload=Budget(n))``), side by side with llama.cpp's plain
mmap (llama-cpp-python) and our own plain mmap under the same memory limit.

Each run is a child process started with the model file evicted from the
page cache (``posix_fadvise(DONTNEED)``). Budgets are fractions of the
weights (100%, 50%, 25%). For the 50% and 25% rows every engine also runs
inside a memory cgroup (v1, a child of this process's own cgroup, removed
afterwards) limited to

set by each child right after loading (building Gemma-3's tokenizer peaks
far above what decoding needs), as its anonymous RSS then + budget + KV +
24 MiB: every engine gets the same room for weights beyond its own heap.
The cgroup counts anonymous memory and page cache, so a plain mmap is
squeezed into that room. Where no cgroup can be made the
limited rows are skipped and the script says so.

Printed per run (medians over ``--reps``, engines alternating): decode
tok/s (``--tokens`` greedy tokens after a short prompt), bytes the process
read from storage per decoded token (``read_bytes`` of /proc/self/io over
the decode), the pager's own bytes_read per token, and peak RSS.

    python benches/bench_offload.py [--model PATH] [--reps 3] [--tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cpu import describe as describe_cpu

PROMPT = "The history of the printing press begins"
SLACK = 24 << 20


def status(key: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def read_bytes() -> int:
    with open("/proc/self/io", encoding="utf-8") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def weights(path: str) -> int:
    from oxillama._native import GgufFile

    return sum(t[4] for t in GgufFile.open(path).tensors())


def limit_self(cgroup: str, room: int) -> int:
    """Caps this process's cgroup at its anonymous RSS now (after loading)
    plus ``room``; returns the limit. Set after loading because building
    Gemma-3's 262k-token tokenizer peaks far above what decoding needs."""
    limit = status("RssAnon") + room
    Path(cgroup, "memory.limit_in_bytes").write_text(str(limit))
    return limit


def child_oxillama(
    path: str, budget: int, evict: str, n: int, cgroup: str, room: int
) -> dict[str, float]:
    from oxillama import Budget, Engine, SamplerConfig

    e = Engine(
        path,
        context_size=128,
        threads=2,
        sampler=SamplerConfig.greedy(),
        offload=Budget(budget, evict=evict) if budget else None,
    )
    base = status("VmRSS")
    c = e.model.config
    kv = 128 * c["n_head_kv"] * (c["dim_k"] + c["dim_v"]) * 2 * c["n_layer"]
    limit = limit_self(cgroup, room + kv) if cgroup else 0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # peak RSS from here on
    e.generate(PROMPT, 1)
    m0, r0 = e.metrics(), read_bytes()
    t0 = time.perf_counter()
    out = e.generate("", n)
    dt = time.perf_counter() - t0
    m1, r1 = e.metrics(), read_bytes()
    assert len(out.tokens) == n, out.finish_reason
    pager = (m1.get("offload_bytes_read", 0) - m0.get("offload_bytes_read", 0)) / n
    return {
        "tok_s": n / dt,
        "read_per_tok": (r1 - r0) / n,
        "pager_per_tok": pager,
        "hwm": status("VmHWM"),
        "base": base,
        "kv": kv,
        "limit": limit,
        "tokens": out.tokens,
    }


def child_llamacpp(path: str, n: int, cgroup: str, room: int) -> dict[str, float]:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=128, n_threads=2, use_mmap=True, verbose=False)
    # Its KV and compute buffers are anonymous memory, inside RssAnon.
    limit = limit_self(cgroup, room) if cgroup else 0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    toks = llm.tokenize(PROMPT.encode())
    llm.eval(toks)
    nxt = int(llm.scores[llm.n_tokens - 1].argmax())
    llm.eval([nxt])
    r0 = read_bytes()
    t0 = time.perf_counter()
    for _ in range(n):
        logits = llm.scores[llm.n_tokens - 1]
        nxt = int(logits.argmax())
        llm.eval([nxt])
    dt = time.perf_counter() - t0
    r1 = read_bytes()
    return {
        "tok_s": n / dt,
        "read_per_tok": (r1 - r0) / n,
        "pager_per_tok": 0.0,
        "hwm": status("VmHWM"),
        "limit": limit,
    }


def my_cgroup() -> Path | None:
    try:
        for line in open("/proc/self/cgroup", encoding="utf-8"):
            _, ctrl, rel = line.strip().split(":", 2)
            if ctrl == "memory":
                p = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
                return p if p.is_dir() else None
    except OSError:
        pass
    return None


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(
    kind: str, path: str, budget: int, evict: str, n: int, room: int | None, cg: Path | None
) -> dict:
    drop_cache(path)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--model",
        path,
        "--child-budget",
        str(budget),
        "--evict",
        evict,
        "--tokens",
        str(n),
    ]
    if room is not None and cg is not None:
        group = cg / f"oxillama_bench_{os.getpid()}"
        group.mkdir(exist_ok=True)
        procs = group / "cgroup.procs"
        cmd += ["--cgroup", str(group), "--room", str(room)]
        cmd = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    finally:
        if room is not None and cg is not None:
            try:
                (cg / f"oxillama_bench_{os.getpid()}").rmdir()
            except OSError:
                pass
    if out.returncode != 0:
        return {"error": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--child", choices=["oxillama", "llama.cpp"])
    ap.add_argument("--child-budget", type=int, default=0)
    ap.add_argument("--cgroup", default="")
    ap.add_argument("--room", type=int, default=0)
    ap.add_argument("--evict", default="lru")
    args = ap.parse_args()
    if args.model is None:
        from tests._gguf_meta import gemma3_path

        args.model = str(gemma3_path())
    if args.child == "oxillama":
        print(
            json.dumps(
                child_oxillama(
                    args.model, args.child_budget, args.evict, args.tokens, args.cgroup, args.room
                )
            )
        )
        return
    if args.child == "llama.cpp":
        print(json.dumps(child_llamacpp(args.model, args.tokens, args.cgroup, args.room)))
        return

    w = weights(args.model)
    cg = my_cgroup()
    print(f"CPU: {describe_cpu()}")
    print(
        f"model: {Path(args.model).name}, weights {w / 2**20:.1f} MiB; {args.tokens} "
        f"decode tokens, 2 threads, cold page cache per run, {args.reps} reps"
    )
    if cg is None:
        print("no memory cgroup available: limited rows skipped")
    # 100%: the whole file, so every unit (page-rounded) fits.
    full = os.path.getsize(args.model)
    rows: list[tuple[str, str, int, str, int | None]] = [
        ("oxillama", "mmap (no policy)", 0, "lru", None),
        ("llama.cpp", "mmap", 0, "lru", None),
        ("oxillama", "Budget 100%", full, "lru", None),
    ]
    for frac in (0.5, 0.25):
        b = int(w * frac)
        room = b + SLACK
        rows.append(("oxillama", f"Budget {frac:.0%}", b, "lru", None))
        rows.append(("oxillama", f"Budget {frac:.0%}, furthest", b, "furthest", None))
        if cg is not None:
            lim = f"cgroup anon + {room >> 20} MiB"
            rows.append(("oxillama", f"Budget {frac:.0%}, furthest, {lim}", b, "furthest", room))
            rows.append(("oxillama", f"mmap, {lim}", 0, "lru", room))
            rows.append(("llama.cpp", f"mmap, {lim}", 0, "lru", room))
    results: dict[int, list[dict]] = {i: [] for i in range(len(rows))}
    for _ in range(args.reps):
        for i, (kind, _label, b, evict, room) in enumerate(rows):
            results[i].append(run(kind, args.model, b, evict, args.tokens, room, cg))
    print(
        "\n| engine | memory | decode tok/s | read from storage / token | "
        "pager bytes_read / token | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|")
    for i, (kind, label, *_rest) in enumerate(rows):
        ok = [r for r in results[i] if "error" not in r]
        if not ok:
            print(f"| {kind} | {label} | failed: {results[i][0]['error']} | | | |")
            continue

        def med(k: str, ok: list[dict] = ok) -> float:
            return statistics.median(r[k] for r in ok)

        print(
            f"| {kind} | {label} | {med('tok_s'):.1f} | {med('read_per_tok') / 2**20:.1f} MiB | "
            f"{med('pager_per_tok') / 2**20:.1f} MiB | {med('hwm') / 2**20:.0f} |"
            + ("" if len(ok) == len(results[i]) else f" ({len(results[i]) - len(ok)} failed)")
        )
    toks = {
        json.dumps(r.get("tokens"))
        for i, (k, *_x) in enumerate(rows)
        if k == "oxillama"
        for r in results[i]
        if "tokens" in r
    }
    print(f"\noxillama runs with distinct token sequences: {len(toks)} (1 = all identical)")


if __name__ == "__main__":
    main()
