"""llama.cpp's perplexity of the two test models over ``perplexity_text.txt``,
which ``tests/test_perplexity.py`` compares ``Engine.perplexity`` with.

    python tests/reference/make_perplexity_reference.py          # the JSON
    python tests/reference/make_perplexity_reference.py --text 91c978c  # the text

``--text REVISION`` rewrites ``perplexity_text.txt`` from the prose of this
repository's ``docs/*.md`` at that git revision (the committed text was made
at 91c978c; files in name order; code blocks, tables, HTML
and admonition markers left out, Markdown links and code spans reduced to
their text; cut at a paragraph end once 60,000 characters are reached). Run
it only to change the text: the committed file is the reference input, and
the JSON must then be remade.

Without ``--text``: runs llama.cpp's ``llama-perplexity`` (the binary built
with llama-cpp-python 0.3.36's vendored llama.cpp; ``$LLAMA_PERPLEXITY``
overrides the path) on SmolLM2-135M-Instruct Q4_1 and Gemma-3-270M Q4_K_M
with ``-c 512 --chunks 3 -t 2`` (and again with ``-b 512 -fa off``: one
chunk per batch, no flash attention) and writes ``perplexity_llamacpp.json``:
the final estimate and its ``±``, the running estimates per chunk, the
settings, the text's sha256 and llama.cpp's version line. Deterministic on a given
build: rerunning rewrites the same values.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TEXT = HERE / "perplexity_text.txt"
OUT = HERE / "perplexity_llamacpp.json"
LLAMA_PERPLEXITY = Path(
    os.environ.get(
        "LLAMA_PERPLEXITY",
        "/work/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-perplexity",
    )
)
N_CTX = 512
CHUNKS = 3
THREADS = 2
TEXT_CHARS = 60_000
# By default llama-perplexity evaluates four 512-token chunks per batch
# (-b 2048) and picks flash attention itself; oxillama evaluates one chunk at
# a time without it, as these flags make llama.cpp do.
VARIANTS = {"one_chunk_per_batch_no_flash_attn": ["-b", str(N_CTX), "-fa", "off"]}

_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_RUNNING = re.compile(r"\[(\d+)\]([0-9.]+),")


def _page_paragraphs(page: str) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    fenced = False
    for raw in page.splitlines():
        line = raw.strip()
        boundary = line.startswith("```") or fenced or not line
        boundary = boundary or line.startswith(("|", "<", "!!!", "???", ":::", "#"))
        boundary = boundary or line.startswith(("- ", "* ")) or bool(re.match(r"\d+\. ", line))
        if boundary and current:
            out.append(" ".join(current))
            current = []
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or not line or line.startswith(("|", "<", "!!!", "???", ":::")):
            continue
        elif line.startswith("#"):
            out.append(line.lstrip("#").strip())
        else:
            current.append(_LINK.sub(r"\1", line).replace("`", "").replace("**", ""))
    if current:
        out.append(" ".join(current))
    return out


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def docs_prose(revision: str) -> str:
    """The prose paragraphs of docs/*.md at a git revision, as plain text."""
    paragraphs: list[str] = []
    names = _git("ls-tree", "--name-only", f"{revision}:docs").split()
    for name in sorted(n for n in names if n.endswith(".md")):
        paragraphs += _page_paragraphs(_git("show", f"{revision}:docs/{name}"))
    text, size = [], 0
    for p in paragraphs:
        text.append(p)
        size += len(p) + 2
        if size >= TEXT_CHARS:
            break
    return "\n\n".join(text) + "\n"


def model_paths() -> dict[str, Path]:
    sys.path.insert(0, str(ROOT))
    from tests._gguf_meta import gemma3_path, smollm2_path

    return {"smollm2": smollm2_path(), "gemma3": gemma3_path()}


def run_llamacpp(model: Path, extra: list[str]) -> dict[str, object]:
    cmd = [
        str(LLAMA_PERPLEXITY),
        "-m",
        str(model),
        "-f",
        str(TEXT),
        "-c",
        str(N_CTX),
        "--chunks",
        str(CHUNKS),
        "-t",
        str(THREADS),
        *extra,
    ]
    proc = subprocess.run(
        ["nice", "-n", "19", *cmd], capture_output=True, text=True, check=True, timeout=1800
    )
    log = proc.stdout + proc.stderr
    final = _FINAL.search(log)
    if final is None:
        raise SystemExit(f"no final estimate in llama-perplexity's output:\n{log}")
    shown = ["llama-perplexity", "-m", model.name, "-f", TEXT.name, *cmd[5:]]
    return {
        "ppl": float(final.group(1)),
        "ppl_error": float(final.group(2)),
        "running_ppl": [float(v) for _, v in _RUNNING.findall(proc.stdout)],
        "command": " ".join(shown),
    }


def model_reference(model: Path) -> dict[str, object]:
    """llama-perplexity's defaults (what its users run, the value the test
    compares with), and each variant of VARIANTS, which shows how far
    llama.cpp's own figure moves with its batch layout and attention kernel."""
    default = run_llamacpp(model, [])
    return {
        "file": model.name,
        "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
        **default,
        "variants": {name: run_llamacpp(model, extra) for name, extra in VARIANTS.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--text",
        metavar="REVISION",
        help="rewrite perplexity_text.txt from docs/ at this git revision",
    )
    args = ap.parse_args()
    if args.text:
        TEXT.write_text(docs_prose(args.text), encoding="utf-8")
        print(f"wrote {TEXT} ({TEXT.stat().st_size} bytes)")
        return
    version = subprocess.run(
        [str(LLAMA_PERPLEXITY), "--version"], capture_output=True, text=True, check=False
    )
    ref = {
        "llama_cpp": (version.stdout + version.stderr).strip().splitlines()[0],
        "text": TEXT.name,
        "text_sha256": hashlib.sha256(TEXT.read_bytes()).hexdigest(),
        "n_ctx": N_CTX,
        "chunks": CHUNKS,
        "threads": THREADS,
        "models": {name: model_reference(path) for name, path in model_paths().items()},
    }
    OUT.write_text(json.dumps(ref, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(ref, indent=2))


if __name__ == "__main__":
    main()
