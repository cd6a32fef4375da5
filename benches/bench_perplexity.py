"""``oxillama perplexity`` next to llama.cpp's ``llama-perplexity``: the same
models, text, context, chunks and threads, the two tools alternating.

  python benches/bench_perplexity.py
  python benches/bench_perplexity.py --chunks 8 --rounds 5 -t 2
  python benches/bench_perplexity.py --llama-perplexity PATH -m a.gguf -m b.gguf

Each round runs, per model, one tool then the other as fresh processes (the
order flips every round, so neither always runs on a warmer machine). Two
times per run: ``wall``, the whole process (model load included), and
``compute``, the chunks' evaluation and scoring as each tool measures it
(ours: its eval and scoring seconds; llama.cpp: the time between its
"calculating perplexity" and "Final estimate" log lines). The table shows
the medians over the rounds, evaluated tokens per second of compute, each
tool's final estimate, and ours / llama.cpp. llama-perplexity runs with its
defaults (four chunks per batch when -c 512; ``--llama-args`` adds flags,
e.g. "-b 512 -fa off"). The default text is tests/reference/
perplexity_text.txt; the default models SmolLM2-135M-Instruct and
Gemma-3-270M, as the tests find them. Run it on a quiet machine: the figures
only compare within one run.
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cpu import describe as describe_cpu

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_LLAMA = Path(
    "/work/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-perplexity"
)
DEFAULT_TEXT = ROOT / "tests" / "reference" / "perplexity_text.txt"
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_OURS = re.compile(r"eval ([0-9.]+) s .*scoring ([0-9.]+) s")
# llama.cpp's log lines start with minutes.seconds.milliseconds.microseconds.
_STAMP = r"(\d+)\.(\d+)\.(\d+)\.(\d+) \w "


def _stamp(log: str, what: str) -> float:
    m = re.search(_STAMP + r".*" + re.escape(what), log)
    if m is None:
        raise SystemExit(f"no '{what}' line in llama-perplexity's log:\n{log[-2000:]}")
    mins, secs, ms, us = (int(g) for g in m.groups())
    return mins * 60 + secs + ms / 1e3 + us / 1e6


def run(cmd: list[str]) -> tuple[float, str]:
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return wall, p.stdout + p.stderr


def ours(model: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-m", "oxillama", "perplexity", "-m", str(model), "-f", args.file]
    cmd += ["-c", str(args.ctx_size), "--chunks", str(args.chunks), "-t", str(args.threads)]
    wall, log = run([*cmd, "--no-progress"])
    final, times = _FINAL.search(log), _OURS.search(log)
    assert final is not None and times is not None, log
    compute = float(times.group(1)) + float(times.group(2))
    return {"wall": wall, "compute": compute, "ppl": float(final.group(1))}


def llama(model: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [args.llama_perplexity, "-m", str(model), "-f", args.file]
    cmd += ["-c", str(args.ctx_size), "--chunks", str(args.chunks), "-t", str(args.threads)]
    wall, log = run([*cmd, *shlex.split(args.llama_args)])
    final = _FINAL.search(log)
    assert final is not None, log
    compute = _stamp(log, "Final estimate") - _stamp(log, "calculating perplexity")
    return {"wall": wall, "compute": compute, "ppl": float(final.group(1))}


def default_models() -> list[Path]:
    from tests._gguf_meta import gemma3_path, smollm2_path

    return [smollm2_path(), gemma3_path()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", help="GGUF (repeatable)")
    ap.add_argument("-f", "--file", default=str(DEFAULT_TEXT))
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-perplexity", default=str(DEFAULT_LLAMA))
    ap.add_argument("--llama-args", default="", help="extra llama-perplexity flags")
    args = ap.parse_args()
    models = [Path(m) for m in args.model] if args.model else default_models()
    tools = {"oxillama": ours, "llama.cpp": llama}
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        order = list(tools) if r % 2 == 0 else list(reversed(tools))
        for model in models:
            for tool in order:
                runs.setdefault((model.name, tool), []).append(tools[tool](model, args))

    evaluated = args.chunks * args.ctx_size
    print(f"\nCPU: {describe_cpu()}")
    print(
        f"text {Path(args.file).name}, -c {args.ctx_size}, --chunks {args.chunks}, "
        f"-t {args.threads}, {args.rounds} rounds (medians)"
        + (f", llama-perplexity {args.llama_args}" if args.llama_args else "")
        + "\n"
    )
    print("| model | tool | PPL | wall s | compute s | tokens/s | ours / llama.cpp (compute) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model in models:
        med = {
            tool: {
                k: statistics.median(x[k] for x in runs[(model.name, tool)])
                for k in runs[(model.name, tool)][0]
            }
            for tool in tools
        }
        ratio = med["oxillama"]["compute"] / med["llama.cpp"]["compute"]
        for tool in tools:
            m = med[tool]
            # The compute ratio is ours / theirs: below 1, oxillama is faster.
            shown = f"{ratio:.2f}" if tool == "oxillama" else ""
            print(
                f"| {model.name} | {tool} | {m['ppl']:.4f} | {m['wall']:.2f} | "
                f"{m['compute']:.2f} | {evaluated / m['compute']:.1f} | {shown} |"
            )


if __name__ == "__main__":
    main()
