"""A bounded soak of a real ``oxillama serve`` process.

    python benches/soak.py --requests 2000 --concurrency 8 [--json]

Starts the server on the default model (SmolLM2) with a small session bound
and a sessions folder, then sends a fixed mix of requests from
``--concurrency`` clients: completions and chats, streams read to the end
and streams the client abandons after the first event, GBNF and JSON
Schema requests, requests for two choices (``n = 2``, whole and
streamed), stateful sessions (well past ``--max-sessions``, so older ones
are hibernated to disk and restored when they come back), and invalid
requests. A warm-up of the same mix comes first.

After the warm-up and at the end it quiesces (waits for an idle queue,
closes its connections, then refills the session table with the same
``max-sessions`` probe sessions so the live KV is identical) and prints
the server's RSS, free KV pages, open file descriptors and live threads,
and p50/p99 latency of the first and last quarter. The bounds
(``--check`` makes them the exit status):

- no response with a 5xx status other than 503;
- RSS at the end within 5% of RSS after the warm-up;
- free KV pages and open file descriptors back to their warm-up values;
- p99 latency of the last quarter within 1.5x of the first quarter's.

``tests/test_soak.py`` runs a 200-request version in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a quiet village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "A haiku about the sea:",
    "In 1969, astronauts",
    "The quick brown fox",
]
QUESTIONS = [
    "What is the capital of France?",
    "Name a prime number.",
    "Say hello in Spanish.",
    "What colour is the sky?",
    "Give me one word that rhymes with cat.",
]
GRAMMAR = 'root ::= ("yes" | "no") " because " [a-z ]{1,20}'
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
#: Bodies no server should accept; each must be answered with a 4xx.
INVALID: list[tuple[str, bytes]] = [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b'{"prompt": 5}'),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "many"}'),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000000}'),
    ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/v1/completions", b'{"prompt": "hi", "grammar": "root ::= undefined-rule"}'),
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000),
    ("/v1/completions", b'{"prompt": "hi", "model": "no-such-model"}'),
    ("/v1/completions", b'{"prompt": "hi", "temperature": -3}'),
]
#: One block of the request schedule; every quarter of the run is made of
#: whole blocks, so the quarters compare like with like.
BLOCK = (
    ["complete"] * 4
    + ["chat"] * 3
    + ["stream"] * 3
    + ["disconnect"] * 2
    + ["grammar"] * 2
    + ["json"] * 1
    + ["choices"] * 2
    + ["session"] * 3
    + ["invalid"] * 2
)


@dataclass
class Stats:
    statuses: Counter[int] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    latencies: dict[int, float] = field(default_factory=dict)
    bad: list[str] = field(default_factory=list)


@dataclass
class Sessions:
    """Session ids: a new one now and then, and old ones revisited, some
    recent (still live) and some older than the last ``recent`` (so past
    the server's bound: hibernated, they must come back exactly)."""

    rng: random.Random
    recent: int
    turns: dict[str, int] = field(default_factory=dict)
    next_id: int = 0
    max_turns: int = 6

    def pick(self) -> tuple[str, int]:
        alive = [s for s, n in self.turns.items() if n < self.max_turns]
        roll = self.rng.random()
        if not alive or roll < 0.4:
            sid = f"soak-{self.next_id}"
            self.next_id += 1
        elif roll < 0.65 and len(alive) > self.recent:
            sid = self.rng.choice(alive[: -self.recent])
        else:
            sid = self.rng.choice(alive[-self.recent :])
        turn = self.turns.get(sid, 0)
        self.turns[sid] = turn + 1
        # Most recently used last, as the server orders them.
        self.turns[sid] = self.turns.pop(sid)
        return sid, turn


def schedule(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    kinds: list[str] = []
    while len(kinds) < n:
        block = list(BLOCK)
        rng.shuffle(block)
        kinds.extend(block)
    return kinds[:n]


async def one(
    client: httpx.AsyncClient,
    kind: str,
    i: int,
    rng: random.Random,
    sessions: Sessions,
    problems: list[str],
) -> int:
    """Sends request ``i`` of the mix; returns its status."""
    prompt = PROMPTS[i % len(PROMPTS)]
    question = QUESTIONS[i % len(QUESTIONS)]
    greedy = {"temperature": 0, "max_tokens": 12}
    if kind == "complete":
        r = await client.post("/v1/completions", json={"prompt": prompt, **greedy})
        return r.status_code
    if kind == "chat":
        msgs = [{"role": "user", "content": question}]
        r = await client.post("/v1/chat/completions", json={"messages": msgs, **greedy})
        return r.status_code
    if kind in ("stream", "disconnect"):
        msgs = [{"role": "user", "content": question}]
        body = {"messages": msgs, "stream": True, "temperature": 0.7, "seed": i, "max_tokens": 24}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if kind == "disconnect" and line.startswith("data: "):
                    break  # the client goes away mid-stream
            return r.status_code
    if kind == "choices":
        # n > 1: the choices share one prompt evaluation (PromptShare); every
        # other choice is streamed.
        body = {"prompt": prompt, "n": 2, "temperature": 0.8, "seed": i, "max_tokens": 12}
        if i % 2:
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                async for _ in r.aiter_lines():
                    pass
                return r.status_code
        r = await client.post("/v1/completions", json=body)
        return r.status_code
    if kind == "grammar":
        body = {"prompt": f"Q: {question}\nA:", "grammar": GRAMMAR, **greedy, "max_tokens": 24}
        r = await client.post("/v1/completions", json=body)
        return r.status_code
    if kind == "json":
        fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
        msgs = [{"role": "user", "content": "Describe a person as JSON."}]
        body = {"messages": msgs, "response_format": fmt, "temperature": 0, "max_tokens": 40}
        r = await client.post("/v1/chat/completions", json=body)
        return r.status_code
    if kind == "session":
        sid, turn = sessions.pick()
        body = {"prompt": f" Turn {turn}: {prompt}", "session": sid, **greedy}
        r = await client.post("/v1/completions", json=body)
        return r.status_code
    if kind == "invalid":
        path, raw = INVALID[rng.randrange(len(INVALID))]
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
        if not 400 <= r.status_code < 500:
            problems.append(f"invalid body {raw[:60]!r} answered {r.status_code}")
        return r.status_code
    raise ValueError(kind)


async def run_phase(
    url: str, kinds: list[str], start: int, concurrency: int, seed: int, sessions: Sessions
) -> Stats:
    stats = Stats()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(kinds)):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(wid: int) -> None:
        rng = random.Random(seed * 1000 + wid)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                kind = kinds[i]
                t0 = time.perf_counter()
                try:
                    status = await one(client, kind, start + i, rng, sessions, stats.bad)
                except httpx.HTTPError as e:
                    stats.bad.append(f"{kind}: {type(e).__name__}: {e}")
                    status = 599
                stats.latencies[i] = time.perf_counter() - t0
                stats.statuses[status] += 1
                stats.kinds[kind] += 1
                if status >= 500 and status != 503:
                    stats.bad.append(f"{kind} answered {status}")

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return stats


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _thread_names(pid: int) -> dict[str, int]:
    """Live threads by name: a count that grew says which pool grew."""
    names: Counter[str] = Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            names[Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()] += 1
        except OSError:  # the thread ended between the listing and the read
            pass
    return dict(sorted(names.items()))


def _proc(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "threads": int(fields["Threads"]),
        "thread_names": _thread_names(pid),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("oxillama:")] = float(value)
    return out


async def quiesce(url: str, pid: int, max_sessions: int, tag: str) -> dict[str, float]:
    """Waits for an idle server, then makes the live session table the same
    ``max_sessions`` probe sessions every time (the older ones hibernate),
    and reads the server's resources."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for k in range(max_sessions):
            sid = f"probe-{tag}-{k}"
            body = {"prompt": PROMPTS[0], "session": sid, "max_tokens": 1, "temperature": 0}
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()
    for _ in range(200):
        m = _metrics(url)
        if m.get("num_requests_waiting", 0) == 0 and m.get("num_requests_running", 0) == 0:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the server closes the connections we dropped
    return {**_proc(pid), **{k: m[k] for k in ("kv_pages_free", "kv_pages_total") if k in m}}


def percentiles(lat: list[float]) -> tuple[float, float]:
    lat = sorted(lat)
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    return statistics.median(lat), p99


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "oxillama",
        "serve",
        "--port",
        str(port),
        "--threads",
        str(args.threads),
        "--context-size",
        str(args.context_size),
        "--max-batch",
        "4",
        "--kv-pages",
        str(args.kv_pages),
        "--max-sessions",
        str(args.max_sessions),
        "--sessions-dir",
        str(folder),
    ]
    log = open(folder.parent / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {(folder.parent / 'server.log').read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not answer /health in 120 s")


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="oxillama-soak-"))
    folder = work / "sessions"
    folder.mkdir()
    proc, url = start_server(args, folder)
    try:
        sessions = Sessions(random.Random(args.seed), args.max_sessions)
        warm_kinds = schedule(args.warmup, args.seed + 1)
        warm = await run_phase(url, warm_kinds, 0, args.concurrency, args.seed, sessions)
        after_warmup = await quiesce(url, proc.pid, args.max_sessions, "warm")
        kinds = schedule(args.requests, args.seed)
        t0 = time.perf_counter()
        main = await run_phase(url, kinds, args.warmup, args.concurrency, args.seed, sessions)
        wall = time.perf_counter() - t0
        end = await quiesce(url, proc.pid, args.max_sessions, "end")
        metrics = _metrics(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log = (work / "server.log").read_text(errors="replace")
        shutil.rmtree(work, ignore_errors=True)
    q = args.requests // 4
    first = percentiles([main.latencies[i] for i in range(q)])
    last = percentiles([main.latencies[i] for i in range(args.requests - q, args.requests)])
    server_errors = sum(n for s, n in main.statuses.items() if s >= 500 and s != 503)
    server_errors += sum(n for s, n in warm.statuses.items() if s >= 500 and s != 503)
    return {
        "cpu": cpu_model(),
        "requests": args.requests,
        "warmup": args.warmup,
        "concurrency": args.concurrency,
        "max_sessions": args.max_sessions,
        "wall_seconds": wall,
        "statuses": {str(k): v for k, v in sorted((warm.statuses + main.statuses).items())},
        "kinds": dict(main.kinds),
        "server_errors": server_errors,
        "problems": (warm.bad + main.bad)[:20],
        "after_warmup": after_warmup,
        "end": end,
        "first_quarter": {"p50": first[0], "p99": first[1]},
        "last_quarter": {"p50": last[0], "p99": last[1]},
        "session_metrics": {k: v for k, v in metrics.items() if "session" in k},
        "server_log_tail": log[-2000:] if server_errors else "",
    }


def check(r: dict[str, Any]) -> list[str]:
    """The bounds the soak holds the server to; empty when all hold."""
    w, e = r["after_warmup"], r["end"]
    failed = []
    if r["server_errors"]:
        failed.append(f"{r['server_errors']} responses with a 5xx other than 503")
    if e["rss_kib"] > 1.05 * w["rss_kib"]:
        failed.append(f"RSS grew from {w['rss_kib']} KiB to {e['rss_kib']} KiB (> 5%)")
    if e.get("kv_pages_free") != w.get("kv_pages_free"):
        failed.append(f"free KV pages {w.get('kv_pages_free')} -> {e.get('kv_pages_free')}")
    if e["fds"] != w["fds"]:
        failed.append(f"open file descriptors {w['fds']} -> {e['fds']}")
    if r["last_quarter"]["p99"] > 1.5 * r["first_quarter"]["p99"]:
        failed.append(
            f"p99 latency {r['first_quarter']['p99']:.3f} s -> {r['last_quarter']['p99']:.3f} s"
        )
    return failed


def report(r: dict[str, Any]) -> None:
    print(f"CPU: {r['cpu']}; {r['requests']} requests after {r['warmup']} of warm-up, ", end="")
    print(f"concurrency {r['concurrency']}, --max-sessions {r['max_sessions']}")
    print(f"wall {r['wall_seconds']:.1f} s; statuses {r['statuses']}")
    print(f"{'':14s}{'RSS MiB':>9s}{'free KV pages':>15s}{'fds':>6s}{'threads':>9s}")
    for name in ("after_warmup", "end"):
        s = r[name]
        print(
            f"{name:14s}{s['rss_kib'] / 1024:9.1f}{s.get('kv_pages_free', -1):15.0f}"
            f"{s['fds']:6d}{s['threads']:9d}"
        )
    before, after = r["after_warmup"]["thread_names"], r["end"]["thread_names"]
    changed = {
        n: f"{before.get(n, 0)} -> {after.get(n, 0)}"
        for n in sorted(set(before) | set(after))
        if before.get(n, 0) != after.get(n, 0)
    }
    print(f"threads by name that changed: {changed or 'none'}")
    for name in ("first_quarter", "last_quarter"):
        s = r[name]
        print(f"{name:14s}p50 {s['p50'] * 1000:7.1f} ms   p99 {s['p99'] * 1000:7.1f} ms")
    print(f"session metrics: {r['session_metrics']}")
    for p in r["problems"]:
        print("problem:", p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, help="warm-up requests (default: requests/10, >= 60)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-sessions", type=int, default=8)
    ap.add_argument("--context-size", type=int, default=512)
    ap.add_argument("--kv-pages", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 when a bound fails")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = max(60, args.requests // 10)
    r = asyncio.run(soak(args))
    failed = check(r)
    r["failed"] = failed
    if args.json:
        print(json.dumps(r))
    else:
        report(r)
        print("bounds:", "all hold" if not failed else "; ".join(failed))
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
