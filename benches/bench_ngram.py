"""n-gram (prompt-lookup) speculative decoding against the target alone:
SmolLM2-135M-Instruct Q4_1, 2 threads, greedy, chat template.

    python benches/bench_ngram.py [--reps 5] [--tokens 160] [--streams 8]

1. Row cost: a forward pass over r rows (one pending token and r - 1
   drafts, exact rows, every row's logits) against a one-token decode step,
   alternating, medians. ``ROW_COST`` in ``ngram_draft.py`` is this table.
2. One stream: decode tok/s of ``Engine.generate`` and of
   ``SpeculativeEngine(engine, NgramDraft())`` on input-grounded tasks
   (quote a passage, summarize it, extract fields into JSON, edit code) and
   on free-form story writing. Both produce the same tokens (checked); runs
   alternate; medians per task; the ratio of each task and of the grounded
   tasks together (their tokens over their decode seconds) come from the
   same run. Bars: grounded >= 1.8x, free-form >= 0.95x.
3. Concurrent streams: the grounded tasks as ``--streams`` concurrent
   ``AsyncEngine`` requests, with ``speculative="ngram"`` and with
   ``"none"`` (same engine, alternating), generated tokens over wall
   seconds, medians. Bar: speculation faster.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np
from _cpu import describe as describe_cpu

from oxillama import AsyncEngine, Engine, NgramDraft, SamplerConfig, SpeculativeEngine

PASSAGE = (
    "The Great Barrier Reef is the world's largest coral reef system, composed of over "
    "2,900 individual reefs and 900 islands stretching for over 2,300 kilometres over an "
    "area of approximately 344,400 square kilometres. The reef is located in the Coral Sea, "
    "off the coast of Queensland, Australia. It can be seen from outer space and is the "
    "world's biggest single structure made by living organisms. This reef structure is "
    "composed of and built by billions of tiny organisms, known as coral polyps."
)

PERSON = (
    "Maria Gonzalez is a 34-year-old software engineer who lives in Barcelona, Spain. "
    "She works at Nordlicht Systems and her email address is maria.gonzalez@nordlicht.example. "
    "Her phone number is +34 612 345 678."
)

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax


def format_receipt(items, tax_rate):
    lines = []
    for item in items:
        lines.append(f"{item['name']}: {item['price'] * item['quantity']:.2f}")
    lines.append(f"Total: {total_price(items, tax_rate):.2f}")
    return "\\n".join(lines)
"""

GROUNDED = {
    "quote": f"Repeat the following passage word for word.\n\n{PASSAGE}",
    "summarize": f"Here is a passage:\n\n{PASSAGE}\n\nSummarize the passage, quoting its key "
    "sentences.",
    "extract_json": f"Extract the name, age, occupation, city, country, employer, email and "
    f"phone from this text as a JSON object.\n\n{PERSON}",
    "code_edit": f"Add a docstring to each function in this Python code and return the "
    f"whole code.\n\n```python\n{CODE}```",
}
FREE = {"story": "Write a short story about a dragon who learns to bake bread."}


def row_cost(engine: Engine, reps: int) -> dict[int, float]:
    """Medians of an r-row verification pass over a one-token step."""
    s = engine._session
    engine.reset()
    toks = engine.tokenize(PASSAGE * 2, add_special=True)
    s.eval(np.asarray(toks, dtype=np.uint32), False)
    n0 = s.n_past
    sizes = [1, 2, 3, 4, 5, 8, 9, 12, 16, 17]
    times: dict[int, list[float]] = {r: [] for r in sizes}
    for _ in range(reps * 4):
        for r in sizes:
            batch = np.asarray(toks[10 : 10 + r], dtype=np.uint32)
            s.exact_rows = r > 1
            t = time.perf_counter()
            s.eval(batch, r > 1)
            times[r].append(time.perf_counter() - t)
            s.exact_rows = False
            s.truncate(n0)
    engine.reset()
    one = statistics.median(times[1])
    return {r: statistics.median(v) / one for r, v in times.items()} | {0: one}


def prompt_tokens(engine: Engine, text: str) -> list[int]:
    chat = engine.apply_chat_template([{"role": "user", "content": text}])
    return engine.tokenize(chat, add_special=True, parse_special=True)


def single_stream(engine: Engine, args: argparse.Namespace) -> None:
    """Each task decoded by two engines on one model in lock-step blocks
    of ``--block`` tokens (the target alone, then speculative, then the
    target's next block...): this VM is shared, and its speed moves from
    second to second, so each side's blocks run at nearly the same times.
    Splitting a generation into continuations gives the same tokens as one
    call (tested), so the two sides produce the same text."""
    greedy = SamplerConfig.greedy()
    tasks = {**GROUNDED, **FREE}
    toks = {name: prompt_tokens(engine, text) for name, text in tasks.items()}
    other = Engine(engine.model, context_size=1024, threads=2)
    secs: dict[str, dict[str, list[float]]] = {n: {"base": [], "spec": []} for n in tasks}
    ntok: dict[str, int] = {}
    acc: dict[str, float] = {}
    for rep in range(args.reps + 1):  # the first round warms both paths
        for name in tasks:
            engine.reset()
            se = SpeculativeEngine(other, NgramDraft())
            got: dict[str, list[int]] = {"base": [], "spec": []}
            spent = {"base": 0.0, "spec": 0.0}
            done = {"base": False, "spec": False}
            first = True
            while not all(done.values()):
                order = ["base", "spec"] if rep % 2 == 0 else ["spec", "base"]
                for which in order:
                    if done[which]:
                        continue
                    left = args.tokens - len(got[which])
                    prompt: list[int] = toks[name] if first else []
                    n = min(args.block, left)
                    if which == "base":
                        c = engine.generate(prompt, n, sampler=greedy)
                    else:
                        c = se.generate(prompt, n, sampler=greedy)
                    got[which] += c.tokens
                    spent[which] += c.timings.decode_seconds
                    done[which] = c.finish_reason != "length" or len(got[which]) >= args.tokens
                first = False
            if got["base"] != got["spec"]:
                raise SystemExit(f"{name}: speculative tokens differ from the target's")
            ntok[name] = len(got["base"])
            acc[name] = se.stats.acceptance_rate
            if rep:
                for which in ("base", "spec"):
                    secs[name][which].append(spent[which])
    print(
        f"\n2. one stream, greedy, up to {args.tokens} tokens in blocks of {args.block}, "
        f"{args.reps} reps (medians)"
    )
    head = ("task", "tokens", "target tok/s", "ngram tok/s", "ratio", "accept")
    print("{:<14}{:>7}{:>14}{:>13}{:>8}{:>8}".format(*head))
    for name in tasks:
        b = statistics.median(secs[name]["base"])
        s = statistics.median(secs[name]["spec"])
        r = statistics.median(x / y for x, y in zip(*secs[name].values(), strict=True))
        print(
            f"{name:<14}{ntok[name]:>7}{ntok[name] / b:>14.1f}{ntok[name] / s:>13.1f}"
            f"{r:>7.2f}x{acc[name]:>8.2f}"
        )
    # Grounded together: their decode seconds summed, per rep.
    ratios = [
        sum(secs[n]["base"][i] for n in GROUNDED) / sum(secs[n]["spec"][i] for n in GROUNDED)
        for i in range(args.reps)
    ]
    free = [secs["story"]["base"][i] / secs["story"]["spec"][i] for i in range(args.reps)]
    print(
        f"grounded tasks together: {statistics.median(ratios):.2f}x (bar 1.8x; per rep "
        f"{', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(
        f"free-form story: {statistics.median(free):.2f}x (bar 0.95x; per rep "
        f"{', '.join(f'{r:.2f}' for r in free)})"
    )


def streams(args: argparse.Namespace) -> None:
    greedy = SamplerConfig.greedy()
    texts = list(GROUNDED.values())
    chats = [[{"role": "user", "content": texts[i % len(texts)]}] for i in range(args.streams)]

    async def run() -> None:
        eng = AsyncEngine(
            context_size=1024, threads=2, max_batch=args.streams, prefix_cache_bytes=0
        )
        rates: dict[str, list[float]] = {"none": [], "ngram": []}
        tokens: dict[str, list[list[int]]] = {}
        try:
            for rep in range(args.reps + 1):
                order = ["none", "ngram"] if rep % 2 == 0 else ["ngram", "none"]
                for mode in order:
                    before = eng.metrics()
                    t = time.perf_counter()
                    outs = await asyncio.gather(
                        *[eng.chat(c, args.tokens, sampler=greedy, speculative=mode) for c in chats]
                    )
                    wall = time.perf_counter() - t
                    after = eng.metrics()
                    tokens[mode] = [o.tokens for o in outs]
                    n = sum(len(o.tokens) for o in outs)
                    if rep:
                        rates[mode].append(n / wall)
                    if mode == "ngram":
                        d, a = (
                            after[f"speculative_{k}_tokens"] - before[f"speculative_{k}_tokens"]
                            for k in ("drafted", "accepted")
                        )
                        accept = a / d if d else 0.0
                if tokens["none"] != tokens["ngram"]:
                    raise SystemExit("streams: speculative tokens differ")
        finally:
            await eng.close()
        b, s = statistics.median(rates["none"]), statistics.median(rates["ngram"])
        ratios = [y / x for x, y in zip(rates["none"], rates["ngram"], strict=True)]
        print(f"\n3. {args.streams} concurrent AsyncEngine streams, grounded tasks, greedy")
        print(
            f"none {b:.1f} tok/s, ngram {s:.1f} tok/s: {s / b:.2f}x (per rep "
            f"{', '.join(f'{r:.2f}' for r in ratios)}); acceptance {accept:.2f}; bar > 1x"
        )

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--block", type=int, default=16, help="tokens per lock-step block")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip (1,2,3)")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    print(f"CPU: {describe_cpu()}")
    engine = Engine(context_size=1024, threads=2)
    print(f"model: {engine.model.model_path}")
    if "1" not in skip:
        rc = row_cost(engine, args.reps)
        print(f"\n1. row cost (r rows / one decode step of {rc.pop(0) * 1e3:.2f} ms):")
        print("   " + "  ".join(f"r={r}: {v:.2f}" for r, v in rc.items()))
    if "2" not in skip:
        single_stream(engine, args)
    if "3" not in skip:
        streams(args)


if __name__ == "__main__":
    main()
