"""Structured output under a tight token budget: how many sampled JSON
Schema documents parse and validate when ``max_tokens`` is 1x, 1.25x and
1.5x the shortest valid document, for oxillama with its grammar budget,
oxillama without it, and llama.cpp with the same grammar (the GBNF
oxillama compiles from the schema, in llama.cpp's dialect).

    python benches/bench_grammar_budget.py [--seeds 10]

Same prompt, same sampler settings (temperature 0.9, top-k 40, top-p 0.95,
min-p 0.05), one seed per run. This measures validity, not speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema

from oxillama import Engine, Grammar, SamplerConfig
from oxillama.decoding.grammar.json_schema import schema_to_gbnf
from oxillama.model.paths import default_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_grammar_budget import PROMPT, SCHEMAS


def valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    path = default_model_path()
    ours = Engine(path, context_size=512, threads=2)
    try:
        from llama_cpp import Llama, LlamaGrammar

        peer: Any = Llama(str(path), n_ctx=512, n_threads=2, verbose=False)
    except ImportError:
        peer = None
        print("llama-cpp-python is not installed: its column is skipped")
    totals = {"budget": [0, 0], "no budget": [0, 0], "llama.cpp": [0, 0]}
    print(f"{'schema':>6} {'budget':>6} | {'ours+budget':>11} {'ours':>6} {'llama.cpp':>9}")
    for k, schema in enumerate(SCHEMAS):
        m = Grammar.from_json_schema(schema).matcher(ours.tokenizer).min_completion_tokens()
        assert m is not None
        gbnf = schema_to_gbnf(schema)
        for max_tokens in (m, (5 * m) // 4, (3 * m) // 2):
            row = {key: 0 for key in totals}
            for seed in range(args.seeds):
                cfg = SamplerConfig(temperature=0.9, seed=seed)
                for key, budget in (("budget", True), ("no budget", False)):
                    ours.reset()
                    out = ours.generate(
                        PROMPT, max_tokens, sampler=cfg, json_schema=schema, grammar_budget=budget
                    )
                    row[key] += valid(out.text, schema)
                if peer is not None:
                    peer.reset()
                    r = peer.create_completion(
                        PROMPT,
                        max_tokens=max_tokens,
                        temperature=0.9,
                        top_k=40,
                        top_p=0.95,
                        min_p=0.05,
                        seed=seed,
                        grammar=LlamaGrammar.from_string(gbnf, verbose=False),
                    )
                    row["llama.cpp"] += valid(r["choices"][0]["text"], schema)
            for key in totals:
                totals[key][0] += row[key]
                totals[key][1] += args.seeds
            peer_cell = f"{row['llama.cpp']}/{args.seeds}" if peer is not None else "-"
            print(
                f"{k:>6} {max_tokens:>6} | {row['budget']:>8}/{args.seeds} "
                f"{row['no budget']:>3}/{args.seeds} {peer_cell:>9}"
            )
    for key, (ok, n) in totals.items():
        if n and (key != "llama.cpp" or peer is not None):
            print(f"{key}: {ok}/{n} valid ({100 * ok / n:.0f}%)")


if __name__ == "__main__":
    main()
