"""The repacked weights are built in the background from an engine's
creation (``Model.prepare``), not by its first forward pass; ``ready()``
and ``prepare(wait=True)`` wait for them; an offloaded model never builds
them. Each case runs in a fresh interpreter: a process builds a model's
weights once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PREAMBLE = """
import asyncio, sys, time
from oxillama import AsyncEngine, Budget, Engine, SamplerConfig
path = sys.argv[1]
"""


def _run(model_path: Path, body: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", PREAMBLE + body, str(model_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_an_engine_builds_its_weights_before_any_pass(model_path: Path) -> None:
    out = _run(
        model_path,
        """
e = Engine(path, context_size=256, threads=2)
deadline = time.monotonic() + 60
while not e.model.native.weights_ready and time.monotonic() < deadline:
    time.sleep(0.01)
print(e.model.native.weights_ready, e.n_past)
""",
    )
    assert out == "True 0"


def test_ready_waits_and_the_output_is_unchanged(model_path: Path) -> None:
    body = """
async def main():
    async with AsyncEngine(path, context_size=256, threads=2) as ae:
        {wait}
        print(ae.engine.model.native.weights_ready)
        c = await ae.generate(
            "The capital of France is", 12, sampler=SamplerConfig.greedy(), ignore_eos=True
        )
        print(c.tokens)
asyncio.run(main())
"""
    waited = _run(model_path, body.format(wait="await ae.ready()")).splitlines()
    first_pass = _run(model_path, body.format(wait="pass")).splitlines()
    assert waited[0] == "True"
    # Whether the weights were built by the background thread before the
    # first pass or waited for by it, the tokens are the same.
    assert waited[1] == first_pass[1]


def test_an_offloaded_model_never_builds_them(model_path: Path) -> None:
    out = _run(
        model_path,
        """
e = Engine(path, context_size=256, threads=2, offload=Budget(1 << 40))
e.model.prepare(2, wait=True)
e.generate("Hello", 4, ignore_eos=True)
print(e.model.native.weights_ready)
""",
    )
    assert out == "False"
