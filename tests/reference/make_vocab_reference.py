"""Writes llama.cpp's tokenization of the corpus for each vocabulary-only
GGUF that scripts/fetch_vocabs.py fetches (llama.cpp's own
``models/ggml-vocab-*.gguf``).

    pip install llama-cpp-python==0.3.36 gguf     # builds llama.cpp (~10 min)
    python scripts/fetch_vocabs.py
    python tests/reference/make_vocab_reference.py

One file per vocabulary, ``tests/reference/vocabs/<name>.json``:

- ``file_sha256``: the GGUF the ids come from (the tests check they read
  the same bytes)
- ``facts``: BOS/EOS/EOT, add_bos/add_eos, end-of-generation ids, hashes
  of the control-token ids and of every token's bytes (as in
  ``vocab_<model>.json``, by make_reference.vocab_facts)
- ``records``: for every text of ``corpus.TOKEN_TEXTS``,
  ``corpus.FAMILY_MARKUP`` and ``corpus.UNICODE_SPACES``, with
  ``add_special`` and ``parse_special`` on and off, ``Llama.tokenize``'s ids
  and ``llama_detokenize`` of those ids twice: rendering control tokens
  (``detok``) and leaving them out (``detok_plain``), BOS/EOS kept

A vocabulary llama.cpp itself cannot load gets ``{"error": ...}``.
Deterministic: re-running on the same build rewrites identical files.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
OUT = HERE / "vocabs"
sys.path.insert(0, str(ROOT))

from tests.reference.corpus import FAMILY_MARKUP, TOKEN_TEXTS, UNICODE_SPACES  # noqa: E402
from tests.reference.make_reference import vocab_facts  # noqa: E402


def _fetch_vocabs() -> Any:
    spec = importlib.util.spec_from_file_location("fetch_vocabs", ROOT / "scripts/fetch_vocabs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def detokenize(llm: Any, ids: list[int], unparse_special: bool) -> str:
    import llama_cpp

    arr = (llama_cpp.llama_token * len(ids))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(
        llm._model.vocab, arr, len(ids), buf, size, False, unparse_special
    )
    assert 0 <= n <= size, n
    return buf.raw[:n].decode("utf-8", errors="replace")


def reference(path: Path) -> dict[str, Any]:
    import llama_cpp
    from llama_cpp import Llama

    out: dict[str, Any] = {
        "file": path.name,
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "llama_cpp_python": llama_cpp.__version__,
    }
    try:
        llm = Llama(str(path), vocab_only=True, verbose=False)
    except (ValueError, RuntimeError) as e:
        out["error"] = str(e)
        return out
    out["facts"] = vocab_facts(llm)
    records = []
    for text in [*TOKEN_TEXTS, *FAMILY_MARKUP, *UNICODE_SPACES]:
        for add_special in (False, True):
            for parse_special in (True, False):
                ids = [
                    int(i)
                    for i in llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)
                ]
                records.append(
                    {
                        "text": text,
                        "add_special": add_special,
                        "parse_special": parse_special,
                        "ids": ids,
                        "detok": detokenize(llm, ids, True),
                        "detok_plain": detokenize(llm, ids, False),
                    }
                )
    out["records"] = records
    return out


def write(name: str, data: dict[str, Any]) -> None:
    """One record per line: small diffs, readable files."""
    records = data.pop("records", None)
    head = json.dumps(data, ensure_ascii=False, indent=1)
    if records is not None:
        body = ",\n".join(json.dumps(r, ensure_ascii=False) for r in records)
        head = head[:-2] + f',\n "records": [\n{body}\n ]\n}}'
    (OUT / f"{name}.json").write_text(head + "\n", encoding="utf-8")


def main() -> None:
    fv = _fetch_vocabs()
    if fv.main([]) != 0:
        raise SystemExit("fetch_vocabs failed")
    OUT.mkdir(exist_ok=True)
    for name in fv.VOCABS:
        data = reference(fv.vocab_path(name))
        n = len(data.get("records", []))
        write(name, data)
        print(
            f"{name}: {n} records" + (f" (llama.cpp: {data['error']})" if "error" in data else "")
        )


if __name__ == "__main__":
    main()
