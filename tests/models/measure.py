"""Prints the measured figures of the README's "Architectures" table: ours
against llama.cpp's committed references, per reference.

    python -m tests.models.measure

Needs only oxillama and the committed files (not llama.cpp)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file rather than with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.models import _checks as c


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def row(name: str, cache: Path) -> str:
    ref = c.reference(name)
    f32 = c.engine(c.f32_fixture(ref, cache), ref, kv_dtype="f32")
    ours_f32 = f32.eval(ref.tokens, all_logits=True)
    f32.reset()
    greedy_f32 = f32.generate(ref.greedy_prompt, len(ref.greedy_tokens_f32), ignore_eos=True)
    q = c.engine(ref.path, ref)
    ours_q = q.eval(ref.tokens, all_logits=True)
    q.reset()
    greedy_q = q.generate(ref.greedy_prompt, len(ref.greedy_tokens), ignore_eos=True).tokens
    d_f32 = float(np.abs(ours_f32 - ref.logits_f32).max())
    d_q = float(np.abs(ours_q - ref.logits_batched).max())
    agree = float((ours_q.argmax(1) == ref.logits_batched.argmax(1)).mean())
    k = first_difference(greedy_q, ref.greedy_tokens)
    same_f32 = "yes" if greedy_f32.tokens == ref.greedy_tokens_f32 else "no"
    same_q = "yes"
    if k is not None:
        # How close the tie is in our logits, on llama.cpp's path.
        q.reset()
        path = ref.greedy_prompt + ref.greedy_tokens
        step = q.eval(path, all_logits=True)[len(ref.greedy_prompt) - 1 + k]
        margin = float(step.max() - step[ref.greedy_tokens[k]])
        same_q = f"to step {k}, then a tie within {margin:.2f}"
    return (
        f"| {name} | {d_f32:.1e} | {d_q:.2f} / {ref.noise:.2f} | {agree:.0%} | "
        f"{same_f32} / {same_q} |"
    )


def main() -> None:
    print(
        "| reference | F32 max diff | quantized max diff / llama.cpp's own "
        "| argmax | greedy F32 / quantized |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in c.REFERENCES:
            print(row(name, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
