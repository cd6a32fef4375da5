"""selftest: a target that fails on purpose, so the tests can show the
driver counts each kind of outcome and survives every one of them. Not
part of `all`. Exact four-byte inputs trigger each failure (libFuzzer's
mutations almost never rebuild them); anything else passes."""

from __future__ import annotations

import os
import signal
import time

from oxillama import ParameterError, _native

from . import Target

SEEDS = {
    b"SEGV": "a SIGSEGV",
    b"ABRT": "an abort",
    b"HANG": "a 60 s sleep",
    b"EXCP": "a plain exception",
    b"EXIT": "an exit",
    b"PANI": "a Rust panic in a pool worker (an InternalError: a crash for the fuzzer)",
    b"TYPE": "a typed error",
}


class SelfTest(Target):
    name = "selftest"

    def seeds(self) -> list[bytes]:
        return [*SEEDS, b"fine"]

    def run(self, value: bytes) -> None:
        if value == b"SEGV":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif value == b"ABRT":
            os.abort()
        elif value == b"HANG":
            time.sleep(60)
        elif value == b"EXCP":
            raise ValueError("selftest")
        elif value == b"EXIT":
            os._exit(3)
        elif value == b"PANI":
            _native._panic_for_test("worker")
        elif value == b"TYPE":
            raise ParameterError("selftest")


TARGETS = {"selftest": SelfTest}
