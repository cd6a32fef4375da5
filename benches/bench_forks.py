"""Forks of a long session: what eight branches of a 4,000-token document
cost in memory, and that the parent continues as if never forked.

One engine (SmolLM2 by default, f16 KV, 2 threads) reads a document of
about 4,000 tokens of varied text. Eight forks then each answer a
different question (64 greedy tokens). Printed, the CPU named:

- the parent's KV bytes (pages held x page bytes) and the forks' new
  positions' KV bytes (what they wrote: the page each copied on its first
  write plus the pages it filled);
- the process's RSS growth over the eight branches (settled: after a
  collection), against "one session's KV plus the forks' new tokens";
  bar: within 15%;
- whether the parent's next answer equals an unforked copy's (restored
  from a snapshot taken before the first fork).

  python benches/bench_forks.py [--model PATH] [--forks 8] [--tokens 4000]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from _cpu import describe as describe_cpu

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from oxillama import Engine, SamplerConfig  # noqa: E402

TOPICS = (
    "The river delta supports rice farming, fishing villages and migrating birds. ",
    "A compiler lowers source code through intermediate representations into machine code. ",
    "Medieval guilds regulated apprenticeships, prices and the quality of goods. ",
    "Photosynthesis turns light, water and carbon dioxide into sugars and oxygen. ",
    "The orchestra tuned to the oboe before the conductor raised the baton. ",
    "Glaciers carve valleys, leave moraines and feed rivers through the summer. ",
    "A ledger records debits and credits so that every account balances. ",
    "The rover drilled into the crater floor and found layered sediments. ",
)
QUESTIONS = (
    "What do the farmers grow?",
    "What does a compiler produce?",
    "What did guilds regulate?",
    "What does photosynthesis make?",
    "Which instrument tunes the orchestra?",
    "What do glaciers leave behind?",
    "What must every account do?",
    "What did the rover find?",
)


def rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def document(e: Engine, n: int) -> list[int]:
    toks: list[int] = []
    i = 0
    while len(toks) < n:
        toks += e.tokenize(TOPICS[i % len(TOPICS)] * (1 + i % 3))
        i += 1
    return toks[:n]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--forks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--answer", type=int, default=64)
    a = ap.parse_args()
    from tests._gguf_meta import smollm2_path

    path = a.model or str(smollm2_path())
    print(f"cpu: {describe_cpu()}")
    print(f"model: {path}")
    ctx = a.tokens + 2 * a.answer + 64
    e = Engine(
        path,
        context_size=ctx,
        kv_positions=ctx + a.forks * (a.answer + 64),
        threads=2,
        sampler=SamplerConfig.greedy(),
    )
    e.eval(document(e, a.tokens))
    before_fork = e.snapshot_bytes()
    kv = e._session
    n_pages = kv.pages_held
    # The parent's KV: its pages, whole (the last one partly filled).
    page_bytes = e._state.kv_len() // e.n_past * 16
    kv_bytes = n_pages * page_bytes
    print(f"document: {e.n_past} tokens, parent KV {kv_bytes / 1e6:.1f} MB in {n_pages} pages")
    free0 = kv.pool_free_pages
    r0 = rss()
    forks = [e.fork() for _ in range(a.forks)]
    r1 = rss()
    answers = []
    for f, q in zip(forks, QUESTIONS * (a.forks // len(QUESTIONS) + 1), strict=False):
        c = f.generate(f"\nQuestion: {q}\nAnswer:", a.answer, ignore_eos=True)
        answers.append(c.text)
    r2 = rss()
    taken = free0 - kv.pool_free_pages
    new_kv = taken * page_bytes
    print(f"{a.forks} forks made: RSS +{(r1 - r0) / 1e6:.2f} MB (nothing copied)")
    print(
        f"after each answered ({a.answer} tokens): pool pages taken {taken} "
        f"({new_kv / 1e6:.2f} MB: each fork's copied last page and the pages it filled)"
    )
    bound = kv_bytes + new_kv
    growth = r2 - r0
    ratio = (kv_bytes + growth) / bound
    print(
        f"RSS growth over the forks {growth / 1e6:.2f} MB; one session's KV plus the forks' new "
        f"tokens {bound / 1e6:.2f} MB; (parent KV + growth) / that = {ratio:.3f} "
        f"(bar <= 1.15: {'met' if ratio <= 1.15 else 'NOT met'})"
    )
    mine = e.generate("\nSummary:", 32, ignore_eos=True).tokens
    copy = Engine.restore_bytes(before_fork).generate("\nSummary:", 32, ignore_eos=True).tokens
    print(f"parent continues as an unforked copy: {mine == copy}")
    for i, text in enumerate(answers[:3]):
        print(f"fork {i}: {text[:60]!r}")


if __name__ == "__main__":
    main()
