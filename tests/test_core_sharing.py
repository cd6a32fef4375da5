"""Pools of several oxillama processes share the cores
(rust/threadpool/share.rs): while another process of the user decodes on
the same CPUs, a pool runs on its share of them, with the same bits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from oxillama import Engine, _native

#: Decodes until its stdin closes, after saying "ready" once it is busy.
NEIGHBOUR = textwrap.dedent(
    """
    import sys, threading
    from oxillama import Engine, _native
    e = Engine(sys.argv[1], context_size=128, threads=int(sys.argv[2]))
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    e.eval([1, 2, 3])
    print("ready", flush=True)
    while not stop.is_set():
        if e.n_past > 100:
            e.reset()
        e.eval([42])
    """
)

#: Prints the threads its pool ran on after a few forward passes.
OBSERVER = textwrap.dedent(
    """
    import sys
    from oxillama import Engine, _native
    e = Engine(sys.argv[1], context_size=128, threads=int(sys.argv[2]))
    for _ in range(20):
        e.eval([42])
    print(e.threads_in_use, flush=True)
    """
)


def _cores() -> int:
    """The cores the pools' shares are cut from."""
    return _native.physical_core_count()


@contextmanager
def _neighbour(model_path: Path, threads: int) -> Iterator[None]:
    p = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR, str(model_path), str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=60)


def test_a_decoding_neighbour_process_halves_our_pool_and_the_bits_stay(
    model_path: Path,
) -> None:
    # Wider than the machine together, whatever its size: each gets half.
    width = max(2, _cores())
    e = Engine(model_path, context_size=256, threads=width)
    toks = list(range(100, 140))
    alone = e.eval(toks, all_logits=True)
    assert e.threads_in_use == width
    with _neighbour(model_path, width):
        e.reset()
        # The share is read at most once a millisecond: a pass or two late.
        for _ in range(3):
            e.reset()
            shared = e.eval(toks, all_logits=True)
            time.sleep(0.002)
        assert e.threads_in_use == max(1, _cores() // 2), e.threads_in_use
        np.testing.assert_array_equal(shared, alone)
        # Sharing off: the whole width beside the same neighbour.
        off = subprocess.run(
            [sys.executable, "-c", OBSERVER, str(model_path), str(width)],
            env={**os.environ, "OXILLAMA_SHARE_CORES": "0"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(off.stdout) == width
    # The neighbour stopped: its beats age out within 50 ms.
    time.sleep(0.2)
    e.reset()
    np.testing.assert_array_equal(e.eval(toks, all_logits=True), alone)
    assert e.threads_in_use == width
