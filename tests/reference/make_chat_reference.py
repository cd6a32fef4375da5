"""Writes llama-cpp-python's renderings of each family's real chat template.

    pip install llama-cpp-python==0.3.36
    python scripts/fetch_vocabs.py
    python tests/reference/make_chat_reference.py

For every template of ``family_chats.TEMPLATE_FILES`` (files in
chat_templates/) and ``family_chats.GGUF_TEMPLATES`` (the template inside a
vocabulary-only GGUF, with that GGUF's BOS/EOS texts, as llama-cpp-python
reads them), and every conversation of ``family_chats.CONVERSATIONS``:
``Jinja2ChatFormatter``'s prompt, or the error the template raised.
``strftime_now`` is pinned to ``family_chats.FIXED_NOW``. Output:
``chat_families.json`` next to this file.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from tests.reference.family_chats import (  # noqa: E402
    CONVERSATIONS,
    GGUF_TEMPLATES,
    TEMPLATE_FILES,
    fixed_strftime_now,
    template_source,
)


def _vocab_path(name: str) -> Path:
    spec = importlib.util.spec_from_file_location("fetch_vocabs", ROOT / "scripts/fetch_vocabs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path: Path = mod.vocab_path(name)
    return path


def _gguf_template(name: str) -> tuple[str, str, str]:
    from llama_cpp import Llama

    llm = Llama(str(_vocab_path(name)), vocab_only=True, verbose=False)

    def text(t: int) -> str:
        return llm._model.token_get_text(t) if t != -1 else ""

    return llm.metadata["tokenizer.chat_template"], text(llm.token_bos()), text(llm.token_eos())


def render_all(source: str, bos: str, eos: str) -> dict[str, Any]:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    out: dict[str, Any] = {}
    for name, (messages, add_generation_prompt, extra) in CONVERSATIONS.items():
        fmt = Jinja2ChatFormatter(
            source, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
        )
        try:
            out[name] = {"text": fmt(messages=messages, **extra).prompt}  # type: ignore[arg-type]
        except Exception as e:  # the template's raise_exception, or a Jinja error
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def main() -> None:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    Jinja2ChatFormatter.strftime_now = staticmethod(fixed_strftime_now)  # type: ignore[method-assign]
    data: dict[str, Any] = {}
    for stem, (bos, eos) in TEMPLATE_FILES.items():
        data[stem] = render_all(template_source(stem), bos, eos)
    for name in GGUF_TEMPLATES:
        source, bos, eos = _gguf_template(name)
        data[f"gguf:{name}"] = {"bos": bos, "eos": eos, **render_all(source, bos, eos)}
    text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    (HERE / "chat_families.json").write_text(text, encoding="utf-8")
    n = sum(1 for t in data.values() for k, v in t.items() if isinstance(v, dict))
    errors = sum(
        1 for t in data.values() for v in t.values() if isinstance(v, dict) and "error" in v
    )
    print(f"{len(data)} templates, {n} renderings ({errors} raised)")


if __name__ == "__main__":
    main()
