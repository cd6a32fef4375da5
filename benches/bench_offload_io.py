"""How the layer pager should bring weights in: mmap with madvise, or
explicit reads into a pinned buffer pool. Decides `rust/model/pager.rs`.

One pass walks the model's units in forward order (every layer, then the
output head in slices no larger than a layer), as a budget of 25% of the
weights makes the pager do each token (LRU over a cyclic walk evicts every
unpinned unit before its next use). Per unit: bring it in, read the next
one ahead, stream over its bytes (a stand-in for the matmul: a uint64 sum,
memory-bound like the decode kernels), drop the unit the budget pushes out.

- ``mmap`` (what the pager does): the map under ``MADV_RANDOM``,
  ``MADV_POPULATE_READ`` the unit (blocking; it was read ahead),
  ``MADV_WILLNEED`` the next (the kernel reads it asynchronously), evict with
  ``MADV_DONTNEED`` + ``POSIX_FADV_DONTNEED``; the page cache pages are the
  mapped weights, no copy.
- ``pread``: ``preadv`` into a buffer of a pool allocated and touched once,
  the next unit read by a helper thread meanwhile; each read range is then
  dropped from the page cache (``POSIX_FADV_DONTNEED``) so the buffer is
  the only copy.
- ``odirect``: the same with an ``O_DIRECT`` descriptor (no page cache at
  all, DMA straight into the pool).

The file is evicted from the page cache (``posix_fadvise(DONTNEED)``)
before every pass; methods alternate; medians of ``--reps`` passes.

    python benches/bench_offload_io.py [--model PATH] [--reps 5]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cpu import describe as describe_cpu

from oxillama._native import GgufFile

PAGE = mmap.PAGESIZE
MADV_POPULATE_READ = 22  # Linux 5.14+; Python's mmap module lacks the name


def units(path: Path) -> list[tuple[int, int]]:
    """(start, end) page-aligned byte ranges: layers, then head slices."""
    ts = GgufFile.open(str(path)).tensors()
    size = os.path.getsize(path)
    layers: dict[int, list[int]] = {}
    embd = None
    for name, _ty, _dims, off, nb in ts:
        if name.startswith("blk."):
            il = int(name.split(".")[1])
            r = layers.setdefault(il, [off, off + nb])
            r[0], r[1] = min(r[0], off), max(r[1], off + nb)
        elif name == "output.weight" or (name == "token_embd.weight" and embd is None):
            embd = (off, off + nb)

    def rnd(a: int, b: int) -> tuple[int, int]:
        return a // PAGE * PAGE, min(-(-b // PAGE) * PAGE, size)

    out = [rnd(*layers[il]) for il in sorted(layers)]
    largest = max(b - a for a, b in out)
    assert embd is not None
    a = embd[0]
    while a < embd[1]:
        b = min(a + largest, embd[1])
        out.append(rnd(a, b))
        a = b
    return out


def drop_cache(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def compute(view: np.ndarray) -> int:
    n = view.nbytes // 8 * 8
    return int(view[:n].view(np.uint64).sum())


def pass_mmap(path: Path, us: list[tuple[int, int]], window: int) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        drop_cache(fd)
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        mm.madvise(mmap.MADV_RANDOM)  # as the pager: no read-around on faults
        t0 = time.perf_counter()
        for i, (a, b) in enumerate(us):
            if i == 0:
                mm.madvise(mmap.MADV_WILLNEED, a, b - a)
            mm.madvise(MADV_POPULATE_READ, a, b - a)
            if i + 1 < len(us):
                na, nb = us[i + 1]
                mm.madvise(mmap.MADV_WILLNEED, na, nb - na)
            arr = np.frombuffer(mm, dtype=np.uint8, count=b - a, offset=a)
            compute(arr)
            del arr
            if i >= window:
                ea, eb = us[i - window]
                mm.madvise(mmap.MADV_DONTNEED, ea, eb - ea)
                os.posix_fadvise(fd, ea, eb - ea, os.POSIX_FADV_DONTNEED)
        dt = time.perf_counter() - t0
        mm.close()
        return dt
    finally:
        os.close(fd)


def pass_pread(path: Path, us: list[tuple[int, int]], window: int, direct: bool) -> float:
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    plain = os.open(path, os.O_RDONLY)
    largest = -(-max(b - a for a, b in us) // PAGE) * PAGE
    # The pinned pool: one buffer per resident unit plus the one read ahead,
    # page-aligned (O_DIRECT needs it), touched once before timing.
    pool = [mmap.mmap(-1, largest) for _ in range(window + 1)]
    for buf in pool:
        buf.write(b"\0" * largest)
    try:
        drop_cache(plain)

        def read(i: int) -> int:
            a, b = us[i]
            # O_DIRECT wants whole pages; the file's last one reads short.
            with memoryview(pool[i % len(pool)])[: -(-(b - a) // PAGE) * PAGE] as view:
                got = os.preadv(fd, [view], a)
            if not direct:
                os.posix_fadvise(plain, a, b - a, os.POSIX_FADV_DONTNEED)
            return got

        with ThreadPoolExecutor(1) as ahead:
            t0 = time.perf_counter()
            fut = ahead.submit(read, 0)
            for i, (a, b) in enumerate(us):
                got = fut.result()
                if got < min(b - a, os.path.getsize(path) - a):
                    raise RuntimeError(f"short read at {a}: {got}")
                if i + 1 < len(us):
                    fut = ahead.submit(read, i + 1)
                arr = np.frombuffer(pool[i % len(pool)], dtype=np.uint8, count=b - a)
                compute(arr)
                del arr
            dt = time.perf_counter() - t0
        return dt
    finally:
        for buf in pool:
            buf.close()
        os.close(fd)
        os.close(plain)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.25, help="fraction of the weights")
    args = ap.parse_args()
    if args.model is None:
        from tests._gguf_meta import gemma3_path

        args.model = gemma3_path()
    us = units(args.model)
    total = sum(b - a for a, b in us)
    largest = max(b - a for a, b in us)
    window = max(1, int(total * args.budget) // largest - 1)
    print(f"CPU: {describe_cpu()}")
    print(
        f"model: {args.model.name}, {len(us)} units, {total / 2**20:.1f} MiB, "
        f"largest {largest / 2**20:.2f} MiB; {window} resident + 1 read ahead "
        f"({args.budget:.0%} budget); cold page cache each pass"
    )
    methods = {
        "mmap": lambda: pass_mmap(args.model, us, window),
        "pread": lambda: pass_pread(args.model, us, window, direct=False),
        "odirect": lambda: pass_pread(args.model, us, window, direct=True),
    }
    for f in methods.values():
        f()  # warm the code paths once, the same for each
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(args.reps):
        for k, f in methods.items():
            times[k].append(f())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'method':8} {'median s/pass':>14} {'GB/s':>7}  all")
    for k, v in times.items():
        print(
            f"{k:8} {med[k]:14.3f} {total / med[k] / 1e9:7.2f}  " + " ".join(f"{x:.3f}" for x in v)
        )
    print(
        f"ratios (same run): pread/mmap {med['pread'] / med['mmap']:.2f}x, "
        f"odirect/mmap {med['odirect'] / med['mmap']:.2f}x (above 1: mmap faster)"
    )


if __name__ == "__main__":
    main()
