"""Fetch llama.cpp's vocabulary-only GGUF files for the tokenizer tests.

    python scripts/fetch_vocabs.py            # into ~/.cache/oxillama/vocabs
    OXILLAMA_VOCAB_DIR=/some/dir python scripts/fetch_vocabs.py
    python scripts/fetch_vocabs.py --sdist llama_cpp_python-0.3.36.tar.gz

llama.cpp keeps ``models/ggml-vocab-<name>.gguf`` (a tokenizer and nothing
else) with ``.inp``/``.out`` files of HF tokenizers' expected ids. They are
too big to commit (qwen2 5.9 MB, command-r 10.9 MB), and llama.cpp's
repository is not on PyPI, but llama-cpp-python's source distribution
carries a copy of it. So this script downloads that sdist (pinned by
version and sha256), extracts only the files the tests read, and leaves
them in the cache directory. A second run with the files in place returns
at once without touching the network.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST
)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODELS_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"

#: The vocabularies the tests compare against llama.cpp: every one whose
#: tokenizer model and pre-tokenizer oxillama claims to support, plus the
#: ones that must stay a LoadError.
VOCABS = (
    "aquila",  # byte-level BPE, no pre-tokenizer name: "default"
    "baichuan",  # SentencePiece
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",  # tokenizer model "gemma4"
    "gpt-2",
    "gpt-neox",  # no pre-tokenizer name: "default"
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",  # SentencePiece
    "qwen2",
    "qwen35",  # pre-tokenizer "qwen35"
    "refact",
    "starcoder",
    # Tokenizer models oxillama does not build (LoadError): WordPiece and
    # Unigram.
    "bert-bge",
    "nomic-bert-moe",
)

STAMP = ".complete"


def vocab_dir() -> Path:
    """Where the files go: ``$OXILLAMA_VOCAB_DIR`` or ~/.cache/oxillama/vocabs."""
    env = os.environ.get("OXILLAMA_VOCAB_DIR")
    return Path(env) if env else Path.home() / ".cache" / "oxillama" / "vocabs"


def vocab_path(name: str) -> Path:
    return vocab_dir() / f"ggml-vocab-{name}.gguf"


def _wanted(member: str) -> str | None:
    """The file name to extract an sdist member to, or None to skip it."""
    if not member.startswith(MODELS_DIR):
        return None
    name = member[len(MODELS_DIR) :]
    for v in VOCABS:
        stem = f"ggml-vocab-{v}.gguf"
        if name in (stem, stem + ".inp", stem + ".out"):
            return name
    return None


def _stamp_text() -> str:
    return f"{SDIST_SHA256}\n" + "\n".join(VOCABS) + "\n"


def is_complete(folder: Path) -> bool:
    """True when a previous run extracted every vocabulary of this list
    from this sdist."""
    try:
        if (folder / STAMP).read_text(encoding="utf-8") != _stamp_text():
            return False
    except OSError:
        return False
    return all((folder / f"ggml-vocab-{v}.gguf").is_file() for v in VOCABS)


def _download(dest: Path) -> None:
    req = urllib.request.Request(SDIST_URL, headers={"User-Agent": "oxillama-fetch-vocabs"})
    for attempt in range(3):
        try:
            with urllib.request.urlopen(req, timeout=60) as r, dest.open("wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            return
        except OSError as e:
            if attempt == 2:
                raise SystemExit(f"cannot download {SDIST_URL}: {e}") from e
            time.sleep(2 * (attempt + 1))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extract(sdist: Path, folder: Path) -> list[str]:
    """Checks the sdist's hash, then extracts the wanted files (each written
    under a temporary name and renamed, so a killed run leaves no torn
    file)."""
    got = _sha256(sdist)
    if got != SDIST_SHA256:
        raise SystemExit(f"{sdist}: sha256 {got}, expected {SDIST_SHA256}")
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            name = _wanted(member.name)
            if name is None or not member.isfile():
                continue
            src = tar.extractfile(member)
            assert src is not None
            tmp = folder / (name + ".part")
            with tmp.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            tmp.replace(folder / name)
            written.append(name)
    missing = [v for v in VOCABS if f"ggml-vocab-{v}.gguf" not in written]
    if missing:
        raise SystemExit(f"{sdist} has no ggml-vocab file for: {', '.join(missing)}")
    (folder / STAMP).write_text(_stamp_text(), encoding="utf-8")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, help="a local copy of " + SDIST)
    ap.add_argument("--force", action="store_true", help="extract even if already done")
    args = ap.parse_args(argv)
    folder = vocab_dir()
    if is_complete(folder) and not args.force:
        return 0
    t0 = time.monotonic()
    if args.sdist is not None:
        written = extract(args.sdist, folder)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            sdist = Path(tmp) / SDIST
            _download(sdist)
            written = extract(sdist, folder)
    print(
        f"fetch_vocabs: {len(written)} files into {folder} in {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
