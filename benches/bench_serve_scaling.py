"""Batching through the whole stack: ``oxillama serve`` on loopback, driven by
the ``openai`` client, one stream against eight at once.

    python benches/bench_serve_scaling.py [--reps 5] [--tokens 128] [--threads 2]

Each rep runs one streamed completion alone, then eight concurrent ones
(the order flips every rep), every request greedy with ``ignore_eos`` so
each produces exactly ``--tokens`` tokens. The rate of a run is its
generated tokens over the time from the first streamed token to the last
(decode only: prefill is excluded as llama-bench's tg excludes it).
Prints each rep, the medians and the ratio (bar: 8 streams >= 3.5x one
stream), with the CPU. Each rep also gives, from the server's /metrics, the
forward pass and the scheduler's host-side work (sampling, detokenizing,
queueing pieces) per decode step, in ms. Run it on a quiet machine.

On SmolLM2 one stream is already bound by arithmetic, so the ratio stays
near the engine's own ceiling (``bench_batch_ceiling.py``). The bar is
about the models users serve: for a 1-8B shape, write the synthetic 1.7B
with ``python benches/bench_bandwidth.py --write-only`` and pass
``--model ~/.cache/oxillama/synthetic-smollm2-1.7b-q4_k_m.gguf``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _cpu import describe as describe_cpu
from bench_serving import PROMPTS

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"oxillama serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("oxillama serve did not become ready")


async def one(client: object, model: str, prompt: str, tokens: int) -> tuple[float, float, int]:
    """First and last token times and the token count of one streamed
    completion."""
    from openai import AsyncOpenAI

    assert isinstance(client, AsyncOpenAI)
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=tokens,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    first = last = 0.0
    n = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
            n += 1
    return first, last, n


async def run(url: str, streams: int, tokens: int) -> float:
    """Decode tokens per second of ``streams`` concurrent completions."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
        model = (await client.models.list()).data[0].id
        res = await asyncio.gather(
            *(one(client, model, PROMPTS[i % len(PROMPTS)], tokens) for i in range(streams))
        )
    start = max(r[0] for r in res)  # every stream past its prefill
    end = max(r[1] for r in res)
    # Tokens produced after `start`, approximated by each stream's rate.
    produced = 0.0
    for f, last, n in res:
        if n > 1 and last > f:
            per = (last - f) / (n - 1)
            produced += max(0.0, (last - max(f, start)) / per)
    return produced / (end - start)


def step_costs(url: str) -> tuple[float, float, float]:
    """The server's decode steps, decode seconds and host seconds so far."""
    want = {
        "oxillama:decode_steps_total": 0,
        "oxillama:decode_seconds_total": 1,
        "oxillama:scheduler_host_seconds_total": 2,
    }
    got = [0.0, 0.0, 0.0]
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in want:
                got[want[name]] = float(value)
    return got[0], got[1], got[2]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--model", help="GGUF (default: SmolLM2)")
    a = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "oxillama.cli.main", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--threads", str(a.threads), "--max-batch", str(a.streams)]
    if a.model:
        cmd += ["--model", a.model]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(url, proc)
        print(f"cpu: {describe_cpu()}")
        print(f"oxillama serve --threads {a.threads}; {a.tokens} tokens per request, greedy")
        asyncio.run(run(url, 1, 16))  # warm both shapes
        asyncio.run(run(url, a.streams, 16))
        ones: list[float] = []
        manys: list[float] = []
        for rep in range(a.reps):
            order = [1, a.streams] if rep % 2 == 0 else [a.streams, 1]
            for n in order:
                c0 = step_costs(url)
                r = asyncio.run(run(url, n, a.tokens))
                steps, fwd, host = (y - x for x, y in zip(c0, step_costs(url), strict=True))
                (ones if n == 1 else manys).append(r)
                per = 1e3 / max(steps, 1)
                print(
                    f"rep {rep + 1}: {n} stream(s) {r:8.1f} tok/s"
                    f"  (per step: forward {fwd * per:.2f} ms, host {host * per:.2f} ms)",
                    flush=True,
                )
        m1, mn = statistics.median(ones), statistics.median(manys)
        print(f"median: 1 stream {m1:.1f} tok/s, {a.streams} streams {mn:.1f} tok/s")
        print(f"ratio {mn / m1:.2f}x (bar >= 3.5x)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
