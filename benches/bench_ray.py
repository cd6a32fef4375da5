"""Ray Serve against ``oxillama serve`` directly: the same model under the
same load, and how long a session waits when its replica is killed.

Three targets run side by side, idle while another is measured, and are
measured in turn (each round: direct, Ray with 1 replica, Ray with 2):
- direct: one ``oxillama serve`` process, 2 threads;
- ray-1: Ray Serve, 1 replica with 2 threads (Ray's own cost);
- ray-2: Ray Serve, 2 replicas with 1 thread each (scale-out on 2 cores).

Load: ``--streams`` concurrent clients, each sending ``--requests``
streamed completions (a ~40-token prompt, ``--max-tokens`` greedy tokens,
EOS ignored). Every target first takes one full round untimed. Reported:
requests per second (median of the rounds) and time to first token p50
and p99 (all rounds' requests), with the ratios to direct from this run.

Failover: a 2-turn session on ray-2, then ``ray.kill`` on the replica
holding it; the time from the kill to the answered third turn, against a
third turn on a live replica, medians of ``--kills``.

    python benches/bench_ray.py [--rounds 3] [--streams 8] [--kills 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import ray
from _cpu import describe as describe_cpu
from ray import serve

from oxillama.model.paths import default_model_path
from oxillama.serving.http.app_spec import AppSpec
from oxillama.serving.ray.deployment import deployment
from oxillama.serving.ray.options import RayOptions

PROMPT = (
    "The history of lighthouses begins with fires lit on hilltops to guide ships. "
    "Later, towers were built along the coast, and"
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    for _ in range(1200):
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError("the server exited") from None
        time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


async def _one(c: httpx.AsyncClient, url: str, max_tokens: int) -> float:
    body = {
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    ttft = None
    async with c.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                if json.loads(line[6:])["choices"][0]["text"]:
                    ttft = time.perf_counter() - t0
    assert ttft is not None
    return ttft


async def _load(
    url: str, streams: int, requests: int, max_tokens: int
) -> tuple[float, list[float]]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as c:

        async def client() -> list[float]:
            return [await _one(c, url, max_tokens) for _ in range(requests)]

        t0 = time.perf_counter()
        per = await asyncio.gather(*(client() for _ in range(streams)))
        wall = time.perf_counter() - t0
    return streams * requests / wall, [t for p in per for t in p]


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _turn(url: str, sid: str, prompt: str) -> str:
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, headers={"X-Session-Id": sid}, timeout=300)
    r.raise_for_status()
    return str(r.headers["x-oxillama-replica"])


def _actor(replica: str) -> Any:
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].endswith("#" + replica):
            return ray.get_actor(a["name"], namespace=a["namespace"])
    raise RuntimeError(f"no actor for {replica}")


def _actors(app: str) -> int:
    prefix = f"SERVE_REPLICA::{app}#"
    return sum(
        a["name"].startswith(prefix) for a in ray.util.list_named_actors(all_namespaces=True)
    )


def _running(app: str, n: int) -> None:
    for _ in range(2400):
        st = serve.status().applications.get(app)
        if st is not None:
            dep = next(iter(st.deployments.values()))
            running = dep.status == "HEALTHY" and dep.replica_states.get("RUNNING", 0) == n
            # The controller reports a killed replica running for a moment.
            if running and _actors(app) == n:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{app} did not get back to {n} replicas")


def _failover(url: str, kills: int) -> tuple[list[float], list[float]]:
    after_kill, live = [], []
    for k in range(kills):
        _running("ray-2", 2)
        sid = f"bench-{k}"
        home = _turn(url, sid, " Tell me about the sea.")
        _turn(url, sid, " And the mountains?")
        t0 = time.perf_counter()
        _turn(url, sid, " Which is older?")
        live.append(time.perf_counter() - t0)
        ray.kill(_actor(home), no_restart=True)
        t0 = time.perf_counter()
        other = _turn(url, sid, " Why?")
        after_kill.append(time.perf_counter() - t0)
        assert other != home
    return after_kill, live


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--requests", type=int, default=4, help="per stream and round")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kills", type=int, default=3)
    a = p.parse_args()
    model = default_model_path()
    print(f"CPU: {describe_cpu()}\nmodel: {model.name}")
    print(
        f"load: {a.streams} streams x {a.requests} requests, {a.max_tokens} tokens each; "
        f"{a.rounds} rounds after one untimed round"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    direct_port = _port()
    direct = subprocess.Popen(
        [
            *(sys.executable, "-m", "oxillama", "serve", "--port", str(direct_port)),
            *("--threads", "2", "--context-size", "512", "--max-batch", "8"),
            *("--sessions-dir", str(work / "direct")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    urls = {"direct": f"http://127.0.0.1:{direct_port}"}
    # Logical CPUs: both Ray apps are deployed at once (idle when not measured).
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
    try:
        ray_port = _port()
        serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
        spec = AppSpec(str(model), context_size=512, max_batch=8, sessions_dir=str(work / "ray"))
        for name, opts in (
            ("ray-1", RayOptions(replicas=1, replica_cpus=2, name="ray1")),
            ("ray-2", RayOptions(replicas=2, replica_cpus=1, name="ray2")),
        ):
            serve.run(deployment(spec, opts), name=name, route_prefix=f"/{name}")
            urls[name] = f"http://127.0.0.1:{ray_port}/{name}"
        for url in urls.values():
            _wait(url, direct)
        rps: dict[str, list[float]] = {k: [] for k in urls}
        ttft: dict[str, list[float]] = {k: [] for k in urls}
        for url in urls.values():  # the untimed round
            asyncio.run(_load(url, a.streams, a.requests, a.max_tokens))
        for r in range(a.rounds):
            for name, url in urls.items():
                x, ts = asyncio.run(_load(url, a.streams, a.requests, a.max_tokens))
                rps[name].append(x)
                ttft[name].extend(ts)
                p50 = _pct(ts, 0.5) * 1e3
                print(f"  round {r + 1} {name:7s} {x:6.2f} req/s  TTFT p50 {p50:7.1f} ms")
        base = statistics.median(rps["direct"])
        print("\n| target | req/s | vs direct | TTFT p50 (ms) | TTFT p99 (ms) |")
        print("|---|---|---|---|---|")
        for name in urls:
            m = statistics.median(rps[name])
            print(
                f"| {name} | {m:.2f} | {m / base:.2f}x | {_pct(ttft[name], 0.5) * 1e3:.0f} "
                f"| {_pct(ttft[name], 0.99) * 1e3:.0f} |"
            )
        after_kill, live = _failover(urls["ray-2"], a.kills)
        print(
            f"\nfailover (ray-2, medians of {a.kills}): turn after the kill "
            f"{statistics.median(after_kill) * 1e3:.0f} ms (each: "
            + ", ".join(f"{x * 1e3:.0f}" for x in after_kill)
            + f"); turn on the live replica {statistics.median(live) * 1e3:.0f} ms"
        )
    finally:
        serve.shutdown()
        ray.shutdown()
        direct.terminate()
        direct.wait(timeout=60)


if __name__ == "__main__":
    main()
