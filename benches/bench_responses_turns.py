"""Time to first token per turn of a 20-turn agent conversation through
``/v1/responses``: once chaining ``previous_response_id`` (each turn
continues the stored response's session, prompt and reply, so only the
new input is evaluated) and once resending the whole history
(``store: false``: every turn's prompt is evaluated, but for the blocks
the server's prefix cache holds from earlier requests).

    python benches/bench_responses_turns.py [--turns 20] [--threads N] [--json]

The conversation is an agent loop: a user asks about a city (the model
must call ``get_weather``: ``tool_choice: "required"``), the tool's
output goes back, the model answers (``"auto"``: it may call again), and
the next question follows; the
same greedy conversation runs both ways, and the ``same`` column says
whether both gave the same reply (they must). A turn's time to first
token is the time from sending the request to its first event
(``response.created``, which the server sends once the first token is
out). It starts ``oxillama serve`` on SmolLM2-135M (or ``--model``) and
prints the CPU, a table per turn and the totals."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import describe

CITIES = [
    "Paris", "Rome", "Berlin", "Madrid", "Lisbon", "Vienna", "Prague", "Oslo", "Dublin", "Athens",
    "Warsaw", "Budapest", "Helsinki", "Brussels", "Amsterdam", "Zurich", "Copenhagen", "Sofia",
]  # fmt: skip
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city: sky, temperature, wind",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
INSTRUCTIONS = (
    "You are a travel assistant. Use get_weather to look up the weather, then answer the "
    "traveller in two sentences with advice on what to wear."
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "oxillama", "serve", "--port", str(port)]
    cmd += ["--context-size", str(args.context_size), "--max-sessions", str(2 * args.turns + 4)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited; see {log}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not become ready in 180 s")


def post(client: httpx.Client, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Time to the first event, and the finished response."""
    t0 = time.perf_counter()
    ttft = None
    final: dict[str, Any] | None = None
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"HTTP {r.status_code}: {r.text}")
        for line in r.iter_lines():
            if ttft is None and line.startswith("event: "):
                ttft = time.perf_counter() - t0
            if line.startswith("data: "):
                ev = json.loads(line[6:])
                if ev["type"] in ("response.completed", "response.incomplete"):
                    final = ev["response"]
                elif ev["type"] == "error":
                    raise SystemExit(f"stream error: {ev}")
    assert ttft is not None and final is not None
    return ttft, final


def _reply(resp: dict[str, Any]) -> str:
    return json.dumps([{k: v for k, v in i.items() if k not in ("id", "call_id")}
                       for i in resp["output"]])  # fmt: skip


def run(client: httpx.Client, turns: int, max_tokens: int, chain: bool) -> list[dict[str, Any]]:
    """The conversation, one request per turn; each row: ttft, input and
    cached tokens, the reply."""
    rows: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    previous: str | None = None
    pending: list[dict[str, Any]] = []
    city = 0
    for t in range(turns):
        if not pending:
            pending = [{"role": "user", "content": f"I am flying to {CITIES[city % len(CITIES)]} "
                        "tomorrow. What should I pack?"}]  # fmt: skip
            city += 1
            choice = "required"
        else:
            # "auto", not "none": a request without tools renders another
            # system prompt, and the conversation would diverge there.
            choice = "auto"
        body: dict[str, Any] = {
            "instructions": INSTRUCTIONS,
            "tools": TOOLS,
            "tool_choice": choice,
            "temperature": 0,
            "max_output_tokens": max_tokens,
        }
        if chain:
            body |= {"input": pending, "previous_response_id": previous, "store": True}
        else:
            body |= {"input": [*history, *pending], "store": False}
        ttft, resp = post(client, body)
        usage = resp["usage"]
        rows.append(
            {
                "turn": t + 1,
                "ttft_s": ttft,
                "input_tokens": usage["input_tokens"],
                "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
                "reply": _reply(resp),
            }
        )
        history += [*pending, *resp["output"]]
        previous = resp["id"]
        calls = [i for i in resp["output"] if i["type"] == "function_call"]
        pending = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": json.dumps({"sky": "light rain", "celsius": 11 + t % 7, "wind_kmh": 20}),
            }
            for c in calls
        ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--context-size", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0, help="default: the server's")
    ap.add_argument("--model", default=None, help="a GGUF (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start(args, Path(tmp) / "server.log")
        try:
            with httpx.Client(base_url=url, timeout=600) as client:
                # One short request first: the first one pays one-time costs.
                post(client, {"input": "Hi", "max_output_tokens": 1, "store": False})
                chained = run(client, args.turns, args.max_tokens, chain=True)
                whole = run(client, args.turns, args.max_tokens, chain=False)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    if args.json:
        print(json.dumps({"cpu": describe(), "chained": chained, "whole": whole}, indent=1))
        return
    print(f"CPU: {describe()}")
    print(f"{args.turns} turns, greedy, max_output_tokens {args.max_tokens}; time to first token:")
    print(f"{'turn':>4} {'input':>6} {'cached':>6} {'chained ms':>11} {'whole ms':>9} {'same':>5}")
    for c, w in zip(chained, whole, strict=True):
        print(
            f"{c['turn']:>4} {c['input_tokens']:>6} {c['cached_tokens']:>6} "
            f"{c['ttft_s'] * 1e3:>11.1f} {w['ttft_s'] * 1e3:>9.1f} "
            f"{'yes' if c['reply'] == w['reply'] else 'NO':>5}"
        )
    tc, tw = sum(r["ttft_s"] for r in chained), sum(r["ttft_s"] for r in whole)
    print(f"total time to first token: chained {tc:.2f} s, whole history {tw:.2f} s")


if __name__ == "__main__":
    main()
