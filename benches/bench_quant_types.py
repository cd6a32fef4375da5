"""Every i-quant, ternary and MXFP4 kind of the synthetic 1.7B against
llama.cpp: pp512 and tg128 at 2 threads, one table.

For each kind, ``bench_bandwidth.py --kind`` writes (once) SmolLM2-1.7B's
shapes with random but valid blocks of that type in every layer matrix and
the token embedding, and ``bench_vs_llamacpp.py`` times both engines on it
exactly as it does for the real models: each in a fresh process, warmed
with a full prefill and a full decode, alternating, medians of ``--reps``.
Nothing else may run on the machine meanwhile.

  python benches/bench_quant_types.py                   # all five, --reps 3
  python benches/bench_quant_types.py --kinds iq4_xs,mxfp4 --reps 5
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from _cpu import describe as describe_cpu

HERE = Path(__file__).resolve().parent
KINDS = ("iq4_xs", "iq3_s", "iq2_xxs", "tq2_0", "mxfp4")
RATIO = re.compile(r"threads=\d+: pp ([\d.]+)x\s+tg ([\d.]+)x")
ROW = re.compile(r"^\s+\d+\s+(oxillama|llama\.cpp)\s+([\d.]+)\s+([\d.]+)", re.M)


def model_for(kind: str) -> str:
    out = subprocess.run(
        [sys.executable, str(HERE / "bench_bandwidth.py"), "--kind", kind, "--write-only"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma list (default: all five)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    a = ap.parse_args()
    print(f"cpu: {describe_cpu()}")
    table = []
    for kind in a.kinds.split(","):
        model = model_for(kind)
        out = subprocess.run(
            [
                sys.executable,
                str(HERE / "bench_vs_llamacpp.py"),
                *("--model", model, "--threads", a.threads, "--reps", str(a.reps)),
                *("--pp", str(a.pp), "--tg", str(a.tg), "--inner", "1"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"== {kind}\n{out.stdout}", flush=True)
        rows = {m[1]: (float(m[2]), float(m[3])) for m in ROW.finditer(out.stdout)}
        ratio = RATIO.search(out.stdout)
        assert ratio is not None and len(rows) == 2, out.stdout
        table.append((kind, rows["oxillama"], rows["llama.cpp"], ratio.groups()))
    print(f"\nsynthetic SmolLM2-1.7B, {a.threads} threads, medians of {a.reps} (tok/s)\n")
    pp, tg = f"pp{a.pp}", f"tg{a.tg}"
    print(f"| kind | {pp} ours | {pp} llama.cpp | ratio | {tg} ours | {tg} llama.cpp | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, ours, theirs, (rp, rt) in table:
        print(
            f"| {kind.upper()} | {ours[0]:.1f} | {theirs[0]:.1f} | {rp}x "
            f"| {ours[1]:.1f} | {theirs[1]:.1f} | {rt}x |"
        )


if __name__ == "__main__":
    main()
