"""The process `scripts/fuzz.py` supervises: one target under atheris.

Before each input it writes the input's saved form at offset 0 of a shared
file and an ``S`` record (its length) on the report pipe; after it, a ``D``
record with the outcome. A worker that dies or stalls inside an input
therefore leaves the driver the exact input, and nothing it does can end
the driver's run.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import struct
import sys
import traceback
from pathlib import Path
from typing import Any

OK, TYPED, CRASH = 0, 1, 2
# Structured targets start from random bytes for hypothesis to draw from.
RANDOM_SEEDS, RANDOM_SEED_LEN, STRUCTURED_MAX_LEN = 16, 4096, 8192
RAW_NAME = "current-raw"
START = struct.Struct("<cII")
DONE = struct.Struct("<cBI")
# A crash's message: the input's length, the input, then the traceback (by
# the time the driver reads it, the shared file may hold the next input).
CRASH_INPUT = struct.Struct("<I")


def _crash(saved: bytes) -> bytes:
    trace = traceback.format_exc().encode(errors="replace")
    return CRASH_INPUT.pack(len(saved)) + saved + trace


def _seed_corpus(target: Any, corpus: Path, seed: int) -> int:
    """Writes the initial corpus on a worker's first start (a restarted
    worker goes on from the corpus grown so far); returns libFuzzer's
    maximum input length."""
    corpus.mkdir(parents=True, exist_ok=True)
    if target.strategy is not None:
        if not any(corpus.iterdir()):
            rng = random.Random(seed)
            for i in range(RANDOM_SEEDS):
                (corpus / f"random-{i}").write_bytes(rng.randbytes(RANDOM_SEED_LEN))
        return STRUCTURED_MAX_LEN
    if not any(corpus.iterdir()):
        for s in target.seeds():
            (corpus / f"seed-{hashlib.sha1(s).hexdigest()}").write_bytes(s)
    longest = max((p.stat().st_size for p in corpus.iterdir()), default=0)
    return max(4096, longest + longest // 4)


def main(
    name: str,
    report_fd: int,
    input_path: Path,
    corpus: Path,
    workdir: Path,
    seed: int,
) -> None:
    import atheris

    # Coverage comes from oxillama's Python code (the Rust core is not
    # instrumented): the snapshot, tokenizer, grammar and template layers.
    with atheris.instrument_imports(include=["oxillama"]):
        for module in ("oxillama", "oxillama.decoding.grammar", "oxillama.sessions.spec"):
            importlib.import_module(module)
        from fuzz_targets import load

        target = load(name)
    from oxillama import InternalError, OxiLlamaError

    target.setup(workdir)
    max_len = _seed_corpus(target, corpus, seed)
    report = os.fdopen(report_fd, "wb", buffering=0)
    current = os.open(input_path, os.O_RDWR | os.O_CREAT, 0o600)
    # The fuzzer's own bytes, so the driver can drop an input that hung or
    # killed the worker from the corpus the next worker starts from.
    current_raw = os.open(input_path.with_name(RAW_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    raw_len = 0

    def one(value: Any) -> None:
        unsaved: Exception | None = None
        try:
            saved = value if target.strategy is None else target.encode(value)
        except Exception as e:  # a harness bug: reported as a crash, repr kept
            saved, unsaved = repr(value).encode(errors="replace"), e
        os.pwrite(current, saved, 0)
        report.write(START.pack(b"S", len(saved), raw_len))
        outcome, message = OK, b""
        try:
            if unsaved is not None:
                raise RuntimeError("the fuzz target cannot save this input") from unsaved
            target.run(value)
        except InternalError:  # a Rust panic, typed for users, a bug for us
            outcome, message = CRASH, _crash(saved)
        except OxiLlamaError as e:
            outcome, message = TYPED, type(e).__name__.encode()
        except BaseException:  # PanicException is a BaseException
            outcome, message = CRASH, _crash(saved)
        report.write(DONE.pack(b"D", outcome, len(message)) + message)

    if target.strategy is None:

        def test_one_input(data: bytes) -> None:
            nonlocal raw_len
            raw_len = len(data)
            os.pwrite(current_raw, data, 0)
            one(data)

    else:
        from hypothesis import given, settings

        @settings(database=None, deadline=None)
        @given(target.strategy)
        def drawn(value: Any) -> None:
            one(value)

        fuzz_one_input = drawn.hypothesis.fuzz_one_input  # type: ignore[attr-defined]

        def test_one_input(data: bytes) -> None:
            nonlocal raw_len
            raw_len = len(data)
            os.pwrite(current_raw, data, 0)
            fuzz_one_input(data)

    args = [
        sys.argv[0],
        str(corpus),
        f"-seed={seed}",
        f"-max_len={max_len}",
        "-rss_limit_mb=4096",
        # The driver times inputs out (2 s) and owns crash handling: let a
        # fatal signal end this process plainly.
        "-timeout=3600",
        "-handle_segv=0",
        "-handle_bus=0",
        "-handle_abrt=0",
        "-handle_ill=0",
        "-handle_fpe=0",
        "-print_final_stats=0",
    ]
    try:
        atheris.Setup(args, test_one_input)
        atheris.Fuzz()
    finally:
        target.close()


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]),
        Path(sys.argv[3]),
        Path(sys.argv[4]),
        Path(sys.argv[5]),
        int(sys.argv[6]),
    )
