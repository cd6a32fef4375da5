"""Memory under many session ids: a real ``oxillama serve`` with
``--max-sessions 16`` and a sessions folder, sent ``--ids`` fresh session
ids (default 1,000), one turn each, then a second turn on every one.

    python benches/session_memory.py [--ids 1000] [--max-sessions 16] [--json]

Prints the server's RSS with no session, with ``max-sessions`` live ones,
its peak while the ids arrive and at the end, and how many second turns
continued exactly. A second turn's reference is the same two turns sent
back to back to a session that never left memory. The bounds
(``--check`` makes them the exit status):

- RSS never exceeds the RSS with ``max-sessions`` live sessions by more
  than one session's worth plus 5%: the bound holds memory, whatever the
  number of ids;
- every hibernated session continues exactly (same text, token for token,
  greedy).

With ``--budget SIZE`` it measures ``--max-session-memory`` instead: for
each KV cache type of ``--kv-types`` (default f16, q8_0, q4_0; keys and
values alike) a server with that budget (and no practical count bound) is
sent ``--sessions`` fresh sessions of about ``--tokens`` tokens each (one
turn: the prompt and one generated token), one after another; once the
last turn's fit is done it reads how many sessions are live, the KV bytes
they hold and the server's RSS (before the first session and at the end).
It prints those and the ratios of live sessions against f16's:

    python benches/session_memory.py --budget 256M [--tokens 1000] [--sessions 48]

The best ratio the cache types allow is their bytes per element: f16 64
bytes per 32 elements, q8_0 34, q4_0 18 (64/18 = 3.56x); the measured
ratio of counts also carries the rounding down of budget / session size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import PROMPTS, _free_port, _metrics, _proc, cpu_model, start_server

TURN2 = " And then, after that,"


def turn(client: httpx.Client, sid: str, prompt: str) -> str:
    body = {"prompt": prompt, "session": sid, "max_tokens": 8, "temperature": 0}
    r = client.post("/v1/completions", json=body)
    r.raise_for_status()
    return str(r.json()["choices"][0]["text"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="oxillama-sessmem-"))
    folder = work / "sessions"
    folder.mkdir()
    args.threads, args.context_size, args.kv_pages = 2, 512, 1024
    proc, url = start_server(args, folder)
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _proc(proc.pid)["rss_kib"])
            time.sleep(0.02)

    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            # References: both turns back to back, the session never leaves.
            ref = []
            for k, p in enumerate(PROMPTS):
                turn(c, f"ref-{k}", p)
                ref.append(turn(c, f"ref-{k}", TURN2))
            # Push the references out, then measure the bound's worth.
            for k in range(args.max_sessions):
                turn(c, f"fill-{k}", PROMPTS[k % len(PROMPTS)])
            time.sleep(0.3)
            rss_bound = _proc(proc.pid)["rss_kib"]
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.perf_counter()
            for i in range(args.ids):
                turn(c, f"id-{i}", PROMPTS[i % len(PROMPTS)])
            first_pass = time.perf_counter() - t0
            same = 0
            wrong = []
            for i in range(args.ids):
                out = turn(c, f"id-{i}", TURN2)
                if out == ref[i % len(PROMPTS)]:
                    same += 1
                else:
                    wrong.append((i, out, ref[i % len(PROMPTS)]))
            stop.set()
            watcher.join()
            end = _proc(proc.pid)["rss_kib"]
            files = len(list(folder.glob("*.oxisnap")))
            metrics = c.get("/metrics").text
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    per_session_kib = None
    for line in metrics.splitlines():
        if line.startswith("oxillama:kv_page_bytes "):
            per_session_kib = float(line.split()[1]) / 1024
    return {
        "cpu": cpu_model(),
        "ids": args.ids,
        "max_sessions": args.max_sessions,
        "rss_with_bound_sessions_kib": rss_bound,
        "rss_peak_kib": peak,
        "rss_end_kib": end,
        "allowed_kib": 1.05 * rss_bound + _session_worth(metrics),
        "first_pass_seconds": first_pass,
        "continued_exactly": same,
        "wrong": wrong[:5],
        "snapshot_files": files,
        "kv_page_kib": per_session_kib,
        "session_metrics": [
            line for line in metrics.splitlines() if "session" in line and not line.startswith("#")
        ],
    }


def _session_worth(metrics: str) -> float:
    """One session of this bench in KiB: its KV pages (two turns of ~20
    tokens fit in 3 pages) plus the logits row it may keep."""
    page = 0.0
    vocab_row = 49152 * 4 / 1024
    for line in metrics.splitlines():
        if line.startswith("oxillama:kv_page_bytes "):
            page = float(line.split()[1]) / 1024
    return 3 * page + vocab_row


#: A paragraph repeated to the wanted prompt length (each session's prompt
#: starts with its own number, so no two are the same).
PARAGRAPH = (
    " The harbour town woke before the sun: fishermen checked their nets, the baker "
    "lit his oven, and gulls argued over the quay while the tide turned slowly."
)


def start_budget_server(
    args: argparse.Namespace, kv: str, folder: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    pages_per_session = -(-(args.tokens + 16) // 16)
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
        str(max(2048, args.tokens + 64)),
        "--max-batch",
        "4",
        # Room in the pool for every session at once: the budget, not the
        # pool, decides who stays (the pool is mapped lazily, so unused
        # pages cost no memory).
        "--kv-pages",
        str(pages_per_session * (args.sessions + 2)),
        "--cache-type-k",
        kv,
        "--cache-type-v",
        kv,
        "--max-sessions",
        str(args.sessions + 1000),
        "--max-session-memory",
        args.budget,
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


def _settled(url: str) -> dict[str, float]:
    """/metrics once the fit after the last turn is done: the live count
    and the KV bytes held stay the same for a second, within the budget."""
    last: tuple[float, float] | None = None
    deadline = time.monotonic() + 120
    while True:
        m = _metrics(url)
        now = (m["sessions_live"], m["sessions_kv_bytes"])
        if now == last and now[1] <= m["sessions_max_kv_bytes"]:
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sessions did not settle under the budget: {now}")
        last = now
        time.sleep(1.0)


def run_budget(args: argparse.Namespace, kv: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"oxillama-sessbudget-{kv}-"))
    folder = work / "sessions"
    folder.mkdir()
    proc, url = start_budget_server(args, kv, folder)
    try:
        with httpx.Client(base_url=url, timeout=600) as c:
            # One stateless request first (scratch buffers, the first pass),
            # and the prompt length of one paragraph.
            r = c.post("/v1/completions", json={"prompt": PARAGRAPH, "max_tokens": 1})
            r.raise_for_status()
            per_paragraph = int(r.json()["usage"]["prompt_tokens"])
            repeats = max(1, round(args.tokens / per_paragraph))
            time.sleep(0.3)
            rss_start = _proc(proc.pid)["rss_kib"]
            prompt_tokens = []
            t0 = time.perf_counter()
            for i in range(args.sessions):
                body = {
                    "prompt": f"Session {i}." + PARAGRAPH * repeats,
                    "session": f"s{i}",
                    "max_tokens": 1,
                    "temperature": 0,
                }
                r = c.post("/v1/completions", json=body)
                r.raise_for_status()
                prompt_tokens.append(int(r.json()["usage"]["prompt_tokens"]))
            seconds = time.perf_counter() - t0
            m = _settled(url)
            rss_end = _proc(proc.pid)["rss_kib"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    live = int(m["sessions_live"])
    held = int(m["sessions_kv_bytes"])
    return {
        "kv": kv,
        "budget_bytes": int(m["sessions_max_kv_bytes"]),
        "sessions": args.sessions,
        "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
        "live": live,
        "hibernated": int(m["sessions_hibernated"]),
        "kv_bytes_held": held,
        "kv_bytes_per_session": held / live if live else None,
        "kv_page_bytes": int(m["kv_page_bytes"]),
        "rss_start_kib": rss_start,
        "rss_end_kib": rss_end,
        "seconds": seconds,
    }


def budget_main(args: argparse.Namespace) -> int:
    rows = [run_budget(args, kv) for kv in args.kv_types.split(",")]
    base = next((r for r in rows if r["kv"] == "f16"), rows[0])
    for r in rows:
        r["live_ratio"] = r["live"] / base["live"] if base["live"] else None
        per, base_per = r["kv_bytes_per_session"], base["kv_bytes_per_session"]
        r["bytes_ratio"] = base_per / per if per and base_per else None
    if args.json:
        print(json.dumps({"cpu": cpu_model(), "rows": rows}))
        return 0
    lo, hi = rows[0]["prompt_tokens"]
    print(
        f"CPU: {cpu_model()}; --max-session-memory {args.budget} "
        f"({rows[0]['budget_bytes']} bytes); {args.sessions} sessions of {lo}-{hi} prompt "
        "tokens, one generated"
    )
    print(
        f"{'kv':6s} {'live':>5s} {'hiber':>5s} {'KiB/session':>12s} {'KV held MiB':>12s} "
        f"{'RSS start MiB':>14s} {'RSS end MiB':>12s} {'live/f16':>9s} {'f16 B/this B':>13s}"
    )
    for r in rows:
        per = r["kv_bytes_per_session"]
        print(
            f"{r['kv']:6s} {r['live']:5d} {r['hibernated']:5d} "
            f"{per / 1024 if per else float('nan'):12.1f} {r['kv_bytes_held'] / 2**20:12.1f} "
            f"{r['rss_start_kib'] / 1024:14.1f} {r['rss_end_kib'] / 1024:12.1f} "
            f"{r['live_ratio'] or float('nan'):9.2f} {r['bytes_ratio'] or float('nan'):13.2f}"
        )
    return 0


def check(r: dict[str, Any]) -> list[str]:
    failed = []
    if r["rss_peak_kib"] > r["allowed_kib"]:
        failed.append(
            f"peak RSS {r['rss_peak_kib'] / 1024:.1f} MiB over the bound's "
            f"{r['allowed_kib'] / 1024:.1f} MiB"
        )
    if r["continued_exactly"] != r["ids"]:
        failed.append(f"{r['ids'] - r['continued_exactly']} sessions did not continue exactly")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ids", type=int, default=1000)
    ap.add_argument("--max-sessions", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument(
        "--budget",
        metavar="SIZE",
        help="measure --max-session-memory SIZE instead (see above)",
    )
    ap.add_argument("--kv-types", default="f16,q8_0,q4_0", help="with --budget")
    ap.add_argument("--tokens", type=int, default=1000, help="with --budget: per session")
    ap.add_argument("--sessions", type=int, default=48, help="with --budget: sessions sent")
    ap.add_argument("--threads", type=int, default=2, help="with --budget: server threads")
    args = ap.parse_args()
    if args.budget is not None:
        return budget_main(args)
    r = run(args)
    r["failed"] = check(r)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"CPU: {r['cpu']}; {r['ids']} session ids, --max-sessions {r['max_sessions']}")
        for k in ("rss_with_bound_sessions_kib", "rss_peak_kib", "rss_end_kib", "allowed_kib"):
            print(f"{k:30s} {r[k] / 1024:8.1f} MiB")
        print(f"first turns: {r['first_pass_seconds']:.1f} s; snapshot files {r['snapshot_files']}")
        print(f"continued exactly: {r['continued_exactly']}/{r['ids']}")
        for w in r["wrong"]:
            print("differs:", w)
        print("\n".join(r["session_metrics"]))
        print("bounds:", "all hold" if not r["failed"] else "; ".join(r["failed"]))
    return 1 if args.check and r["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
