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
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import PROMPTS, _proc, cpu_model, start_server

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
    args = ap.parse_args()
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
