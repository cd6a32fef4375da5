"""Writes ``llama_bench.json``: how llama.cpp's llama-bench names and sizes
the test models, which ``oxillama bench`` and ``oxillama info`` must match.

    python tests/reference/make_llama_bench_reference.py --llama-bench PATH

``PATH`` is a built ``llama-bench`` (llama.cpp's tools/llama-bench). The
script runs it once per test model with the smallest settings (a pp8 test,
one thread, one repetition; the timing is thrown away) and keeps, per
model, the markdown table's header lines and ``model``/``size``/``params``
cells, the JSON output's ``model_type``, ``model_size`` and
``model_n_params``, and the JSON record's field names. These depend only
on the files and the build, so re-running it rewrites identical data.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from tests._gguf_meta import gemma3_path, smollm2_path  # noqa: E402

SETTINGS = ["-p", "8", "-n", "0", "-r", "1", "-t", "1"]


def run(binary: str, model: Path, fmt: str) -> str:
    cmd = [binary, "-m", str(model), *SETTINGS, "-o", fmt]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", required=True, metavar="PATH", help="llama-bench binary")
    args = ap.parse_args()
    out: dict[str, object] = {"settings": SETTINGS, "models": {}}
    for name, path in (("smollm2", smollm2_path()), ("gemma3", gemma3_path())):
        md = [line for line in run(args.llama_bench, path, "md").splitlines() if line.strip()]
        row = [c.strip() for c in md[2].strip("|").split("|")]
        (record,) = json.loads(run(args.llama_bench, path, "json"))
        out["md_header"] = md[:2]
        out["json_fields"] = list(record)
        out["models"][name] = {  # type: ignore[index]
            "md_model": row[0],
            "md_size": row[1],
            "md_params": row[2],
            "model_type": record["model_type"],
            "model_size": record["model_size"],
            "model_n_params": record["model_n_params"],
            "build_commit": record["build_commit"],
        }
    target = HERE / "llama_bench.json"
    target.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
