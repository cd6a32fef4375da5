"""Per-token grammar mask time, oxillama against llguidance, on SmolLM2's
49,152-token vocabulary and one nested-object JSON Schema.

    python benches/bench_grammar.py [--reps 3] [--decode-tokens 96]

Both engines compile the schema once, then for each document a fresh
matcher walks the document's tokens: at every step the full mask of allowed
tokens is computed (timed), then the document's next token is consumed.
The documents are valid instances of the schema, serialized compactly and
tokenized with SmolLM2's tokenizer. Reported: compile time, p50 / p99 / max
mask time over all steps (cold first document included), and the agreement
of the two masks on the document's own token. Needs `pip install
llguidance`.

Then greedy decoding on SmolLM2 at 2 threads, constrained by the schema and
unconstrained, alternating, from the same prompt: decode tokens/s of each
(medians; the constrained run includes building its matcher and every mask,
cold caches in the first rep). Bar: constrained >= 90% of unconstrained.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "status": {"enum": ["active", "suspended", "closed"]},
        "email": {"type": "string", "format": "email"},
        "created": {"type": "string", "format": "date-time"},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "country": {"enum": ["FR", "DE", "US", "JP"]},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "country"],
            "additionalProperties": False,
        },
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 999},
                    "paid": {"type": "boolean"},
                },
                "required": ["sku", "qty", "paid"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["id", "name", "status", "email", "created", "address", "orders"],
    "additionalProperties": False,
}

DOCS: list[dict[str, Any]] = [
    {
        "id": "3f2b8c1e-9a4d-4e6f-8b1a-2c3d4e5f6a7b",
        "name": "Ada Lovelace",
        "status": "active",
        "email": "ada@example.com",
        "created": "2024-05-01T12:30:00Z",
        "score": 97.5,
        "tags": ["math", "poet"],
        "address": {"street": "12 Rue de Rivoli", "city": "Paris", "country": "FR", "zip": "75001"},
        "orders": [{"sku": "BK-001", "qty": 2, "paid": True}],
    },
    {
        "id": "00000000-0000-4000-8000-000000000001",
        "name": "Grace Hopper",
        "status": "suspended",
        "email": "grace.hopper@navy.mil",
        "created": "1985-12-09T08:00:00+01:00",
        "address": {"street": "1 Main St", "city": "Arlington", "country": "US"},
        "orders": [],
    },
    {
        "id": "a1b2c3d4-e5f6-4711-8899-aabbccddeeff",
        "name": "Kenji Sato",
        "status": "closed",
        "email": "k.sato@example.jp",
        "created": "2023-01-15T23:59:59Z",
        "score": 12,
        "tags": [],
        "address": {"street": "2-1 Marunouchi", "city": "Tokyo", "country": "JP", "zip": "10000"},
        "orders": [
            {"sku": "CAM-77", "qty": 1, "paid": False},
            {"sku": "LENS-3", "qty": 3, "paid": True},
        ],
    },
]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def run_oxillama(schema: dict[str, Any], docs: list[list[int]], engine: Any) -> dict[str, Any]:
    from oxillama.decoding.grammar import Grammar, vocab_trie

    vocab_trie(engine.tokenizer)  # built once per tokenizer, like llguidance's
    t = time.perf_counter()
    g = Grammar.from_json_schema(schema)
    g.matcher(engine.tokenizer)
    compile_s = time.perf_counter() - t
    times: list[float] = []
    allowed_own: list[bool] = []
    for toks in docs:
        m = g.matcher(engine.tokenizer)
        for tok in toks:
            t = time.perf_counter()
            mask = m.mask()
            times.append(time.perf_counter() - t)
            allowed_own.append(bool(mask[tok // 8] >> (tok % 8) & 1))
            if not m.accept_token(tok):
                break
    return {"compile": compile_s, "times": times, "own": allowed_own}


def run_llguidance(schema: dict[str, Any], docs: list[list[int]], engine: Any) -> dict[str, Any]:
    import llguidance
    import llguidance.numpy as lnp

    tok = llguidance.LLTokenizer(engine.tokenizer.hf.to_str())
    t = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False}
    )
    llguidance.LLMatcher(tok, grammar)
    compile_s = time.perf_counter() - t
    bitmask = lnp.allocate_token_bitmask(1, tok.vocab_size)
    times: list[float] = []
    allowed_own: list[bool] = []
    for toks in docs:
        m = llguidance.LLMatcher(tok, grammar)
        for t_id in toks:
            t = time.perf_counter()
            lnp.fill_next_token_bitmask(m, bitmask, 0)
            times.append(time.perf_counter() - t)
            word = int(bitmask[0, t_id // 32]) & 0xFFFFFFFF
            allowed_own.append(bool(word >> (t_id % 32) & 1))
            if not m.consume_token(t_id):
                break
    return {"compile": compile_s, "times": times, "own": allowed_own}


def run_decode(n_tokens: int, reps: int) -> None:
    from oxillama import Engine, Grammar, SamplerConfig

    engine = Engine(threads=2)
    grammar = Grammar.from_json_schema(SCHEMA)
    prompt = engine.apply_chat_template(
        [{"role": "user", "content": "Write a JSON record for a customer with two orders."}],
        add_generation_prompt=True,
    )
    greedy = SamplerConfig(temperature=0.0)
    free: list[float] = []
    constrained: list[float] = []
    lengths: list[int] = []
    for _ in range(reps):
        engine.reset()
        c = engine.generate(prompt, n_tokens, sampler=greedy, ignore_eos=True)
        free.append(c.decode_tokens_per_second)
        engine.reset()
        c = engine.generate(prompt, n_tokens, sampler=greedy, grammar=grammar)
        constrained.append(c.decode_tokens_per_second)
        lengths.append(len(c.tokens))
    f, g = statistics.median(free), statistics.median(constrained)
    print(f"greedy decode, 2 threads, up to {n_tokens} tokens ({reps} reps, alternating):")
    print(f"  unconstrained {f:.1f} tok/s, schema-constrained {g:.1f} tok/s = {100 * g / f:.1f}%")
    print(f"  constrained lengths {lengths}; first (cold caches) rep {constrained[0]:.1f} tok/s")
    print("  bar: constrained >= 90% of unconstrained")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="passes over the documents")
    ap.add_argument(
        "--decode-tokens", type=int, default=96, help="tokens per decode run (0: skip decoding)"
    )
    args = ap.parse_args()
    from oxillama import Engine

    engine = Engine(context_size=64, threads=1)
    docs = [engine.tokenize(json.dumps(d, separators=(",", ":"))) for d in DOCS] * args.reps
    print(f"vocabulary {engine.vocab_size}, {len(docs)} documents, {sum(map(len, docs))} tokens")
    results = {"oxillama": run_oxillama(SCHEMA, docs, engine)}
    try:
        results["llguidance"] = run_llguidance(SCHEMA, docs, engine)
    except ImportError:
        print("llguidance is not installed: pip install llguidance")
    print(f"{'':12}{'compile ms':>12}{'p50 us':>10}{'p99 us':>10}{'max us':>10}{'mean us':>10}")
    for name, r in results.items():
        us = [x * 1e6 for x in r["times"]]
        print(
            f"{name:12}{r['compile'] * 1e3:12.1f}{pct(us, 50):10.1f}{pct(us, 99):10.1f}"
            f"{max(us):10.1f}{statistics.mean(us):10.1f}"
        )
        if not all(r["own"]):
            print(f"  {name}: {r['own'].count(False)} document tokens were masked out")
    first = [x * 1e6 for x in results["oxillama"]["times"][: len(docs[0])]]
    print(
        f"oxillama, first (cold) document: p50 {np.median(first):.1f} us, max {max(first):.1f} us"
    )
    print("bars: p50 <= 50 us, p99 <= 1000 us, compile <= 10 ms")
    if args.decode_tokens:
        run_decode(args.decode_tokens, 5)


if __name__ == "__main__":
    main()
