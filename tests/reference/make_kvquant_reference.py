"""Writes llama.cpp's reference for quantized KV caches (``kv_quant.json``).

    python tests/reference/make_kvquant_reference.py [--rot on|off|both]

For each cache type (f16 as the baseline, q8_0, q4_0; keys and values
alike) with flash attention on, which llama.cpp needs for a quantized V
cache, llama.cpp (through llama-cpp-python) gives:

- SmolLM2's teacher-forced paragraph (``corpus.PARAGRAPH``) through both of
  its paths, batched and one token at a time: the argmax and the top-8 ids
  and logits of each position;
- 32-token greedy continuations of ``corpus.GREEDY_PROMPTS`` on SmolLM2 and
  Gemma-3, with the top-1/top-2 logit margin of every step (so a test can
  tell a near tie from a real disagreement).

Rotation: this llama.cpp rotates Q and K (and V, undoing it on the
attention output) by an orthonormal Walsh-Hadamard matrix when the cache
side is quantized and the head size a multiple of 64 (``attn_rot_k`` /
``attn_rot_v``), so its cached blocks are those of the rotated rows. Both
settings are recorded: ``types`` with the rotation off
(``LLAMA_ATTN_ROT_DISABLE=1``; f16, and q8_0 and q4_0 teacher-forced, for
our ``OXILLAMA_ATTN_ROT_DISABLE=1``) and ``types_rot`` with llama.cpp's
default (on, as ours), for q8_0 and q4_0 (f16 is never rotated). ``--rot``
rewrites the chosen setting's sections and keeps the other's from the
existing file.

Deterministic: fixed texts, thread count, greedy decoding. The file is
rewritten after each section, so a partial run leaves what it made.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from tests._gguf_meta import gemma3_path, smollm2_path  # noqa: E402
from tests.reference.corpus import GREEDY_PROMPTS, PARAGRAPH  # noqa: E402

N_CTX = 1024
THREADS = 2
SEED = 1234
TOP = 8
GREEDY_TOKENS = 32
OUT = HERE / "kv_quant.json"
# ggml type ids of the cache types.
GGML_TYPES = {"q8_0": 8, "q4_0": 2, "f16": 1}
# Read by llama.cpp (getenv, through os.environ's putenv) whenever it
# creates a KV cache: set before each run.
ROT_ENV = "LLAMA_ATTN_ROT_DISABLE"


def _set_rot(on: bool) -> None:
    if on:
        os.environ.pop(ROT_ENV, None)
    else:
        os.environ[ROT_ENV] = "1"


def _llama(path: Path, kv: str, batch: int, logits_all: bool) -> Any:
    from llama_cpp import Llama

    return Llama(
        str(path),
        n_ctx=N_CTX,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        n_batch=batch,
        n_ubatch=batch,
        logits_all=logits_all,
        seed=SEED,
        flash_attn=True,
        type_k=GGML_TYPES[kv],
        type_v=GGML_TYPES[kv],
        verbose=False,
    )


def teacher_forced(path: Path, kv: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, batch in (("batch", 512), ("seq", 1)):
        llm = _llama(path, kv, batch, True)
        ids = llm.tokenize(PARAGRAPH.encode(), add_bos=False)
        llm.eval(ids)
        lg = np.array(llm.scores[: len(ids)], dtype=np.float32)
        top = np.argsort(-lg, axis=1, kind="stable")[:, :TOP]
        out["tokens"] = [int(i) for i in ids]
        out[f"{name}_top_ids"] = top.astype(int).tolist()
        out[f"{name}_top_logits"] = np.round(np.take_along_axis(lg, top, axis=1), 5).tolist()
        del llm
    return out


def _last_logits(llm: Any) -> np.ndarray:
    """The last evaluated position's logits, read from the context (without
    ``logits_all``, ``llm.scores`` is not filled)."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)


def greedy(path: Path, kv: str, gemma: bool) -> list[dict[str, Any]]:
    llm = _llama(path, kv, 512, False)
    out = []
    for prompt, chat in GREEDY_PROMPTS:
        chat = chat and not gemma
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n" if chat else prompt
        p_ids = llm.tokenize(text.encode(), add_bos=gemma, special=True)
        llm.reset()
        llm.eval(p_ids)
        toks: list[int] = []
        margins: list[float] = []
        for _ in range(GREEDY_TOKENS):
            lg = _last_logits(llm)
            a, b = np.sort(lg)[-2:][::-1]
            t = int(lg.argmax())
            toks.append(t)
            margins.append(round(float(a - b), 5))
            llm.eval([t])
        out.append({"prompt_ids": [int(i) for i in p_ids], "ids": toks, "margins": margins})
    return out


def _rotation_off(data: dict[str, Any], save: Any) -> None:
    """f16 (never rotated) in full; q8_0 and q4_0 unrotated, teacher-forced
    (the opt-out's test, and the rotation's gain on q4_0)."""
    _set_rot(False)
    types: dict[str, dict[str, Any]] = data.setdefault("types", {})
    for kv in ("q8_0", "q4_0"):
        types[kv] = {"smollm2_paragraph": teacher_forced(smollm2_path(), kv)}
        save()
        print(kv, "smollm2 done", flush=True)
    types["f16"] = {
        "smollm2_paragraph": teacher_forced(smollm2_path(), "f16"),
        "smollm2_greedy": greedy(smollm2_path(), "f16", False),
        "gemma3_greedy": greedy(gemma3_path(), "f16", True),
    }
    save()
    print("f16 done", flush=True)


def _rotation_on(data: dict[str, Any], save: Any) -> None:
    _set_rot(True)
    types: dict[str, dict[str, Any]] = data.setdefault("types_rot", {})
    for kv in ("q8_0", "q4_0"):
        types[kv] = {
            "smollm2_paragraph": teacher_forced(smollm2_path(), kv),
            "smollm2_greedy": greedy(smollm2_path(), kv, False),
        }
        save()
        print(kv, "smollm2 (rotated) done", flush=True)
        types[kv]["gemma3_greedy"] = greedy(gemma3_path(), kv, True)
        save()
        print(kv, "gemma3 (rotated) done", flush=True)


def main() -> None:
    import argparse

    import llama_cpp

    ap = argparse.ArgumentParser()
    ap.add_argument("--rot", choices=("on", "off", "both"), default="both")
    rot = ap.parse_args().rot
    data: dict[str, Any] = json.loads(OUT.read_text()) if OUT.is_file() else {}
    data.update(
        {
            "llama_cpp_python": llama_cpp.__version__,
            "flash_attn": True,
            "threads": THREADS,
            "n_ctx": N_CTX,
            # What each group of sections was made with.
            "attn_rot": {"types": False, "types_rot": True},
        }
    )

    def save() -> None:
        OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")

    if rot in ("off", "both"):
        data.pop("types", None)
        _rotation_off(data, save)
    if rot in ("on", "both"):
        data.pop("types_rot", None)
        _rotation_on(data, save)


if __name__ == "__main__":
    main()
