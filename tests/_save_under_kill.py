"""The process tests/test_crash_safe_save.py kills: a session that grows by
one greedy turn at a time and is saved after each, while other requests run
on the same AsyncEngine.

    python tests/_save_under_kill.py PATH --start J [--stop-after M]

``--start J`` restores PATH, which holds trajectory state J (-1: start
empty), and continues with turn J+1. It reports on stdout, one line each:
``ready J`` once loaded; for the save of state I, ``saving I`` when it
starts, ``writing I`` once its temp file exists, ``renamed I`` once it is
committed and ``saved I CAPTURE WRITE`` (seconds before and after the temp
file was created) when it returns. The phases are observed by wrapping
``os.open`` and ``os.replace``; the code that saves is untouched. Even
states are saved by
``AsyncSession.snapshot`` (the server's save), odd ones by
``Engine.snapshot`` (the OXISNAP1 writer), so a kill can land in either.

The trajectory (prompts, tokens per turn) is defined here so that the test
can compute the same states without the child."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oxillama import AsyncEngine, Engine

#: Context of the child's engine, the reference and the restored engines.
CTX = 2048
#: Tokens generated per turn (EOS ignored, so each turn grows by exactly this
#: plus its prompt).
PER_TURN = 6
#: Prompt of turn I: PROMPTS[I % len(PROMPTS)].
PROMPTS = [
    "The river ran past the old mill.",
    " Then the miller said:",
    " Meanwhile, in the town,",
    " The next morning",
]
#: Requests that run alongside the session's turns (looped).
OTHERS = ["Once upon a time", "def fibonacci(n):", "In 1969, astronauts"]
THREADS = 1


def prompt_tokens(engine: Engine, turn: int) -> list[int]:
    return engine.tokenize(PROMPTS[turn % len(PROMPTS)])


async def _others(engine: AsyncEngine, k: int) -> None:
    from oxillama import SamplerConfig

    n = 0
    while True:
        await engine.generate(OTHERS[k], 4 + (n + k) % 8, sampler=SamplerConfig.greedy())
        n += 1


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Phases:
    """Announces when a save's temp file appears and when it is renamed."""

    def __init__(self) -> None:
        from oxillama.sessions.atomic import is_temp

        self.turn = -1
        self.opened = 0.0
        real_open, real_replace = os.open, os.replace

        def open_(path: str, flags: int, mode: int = 0o777, **kw: object) -> int:
            fd = real_open(path, flags, mode, **kw)
            if is_temp(path):
                self.opened = time.perf_counter()
                _say(f"writing {self.turn}")
            return fd

        def replace(src: str, dst: str, **kw: object) -> None:
            real_replace(src, dst, **kw)
            if is_temp(src):
                _say(f"renamed {self.turn}")

        os.open = open_
        os.replace = replace


async def _run(path: str, start: int, stop_after: int | None, concurrent: int) -> None:
    from oxillama import AsyncEngine, Engine, SamplerConfig

    engine = AsyncEngine(context_size=CTX, threads=THREADS, sampler=SamplerConfig.greedy())
    if start >= 0:
        sess = await engine.restore_session(path)
    else:
        sess = engine.session(sampler=SamplerConfig.greedy())
    others = [asyncio.create_task(_others(engine, k)) for k in range(concurrent)]
    loop = asyncio.get_running_loop()
    phases = Phases()
    _say(f"ready {start}")
    turn = start + 1
    while stop_after is None or turn <= stop_after:
        toks = prompt_tokens(engine.engine, turn)
        await sess.generate(toks, PER_TURN, ignore_eos=True)
        phases.turn = turn
        _say(f"saving {turn}")
        t0 = time.perf_counter()
        if turn % 2 == 0:
            await sess.snapshot(path)
        else:
            fork = Engine.restore_bytes(await sess.snapshot_bytes())
            await loop.run_in_executor(None, fork.snapshot, path)
        t1 = time.perf_counter()
        _say(f"saved {turn} {phases.opened - t0:.4f} {t1 - phases.opened:.4f}")
        turn += 1
    for t in others:
        t.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--concurrent", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(_run(a.path, a.start, a.stop_after, a.concurrent))


if __name__ == "__main__":
    main()
