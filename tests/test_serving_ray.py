"""oxillama on a local Ray cluster: two replicas behind Ray Serve, driven
with the `openai` client. A session's turns stay on one replica; when that
replica's actor is killed between turns 2 and 3, turn 3 is answered by the
other replica with exactly the tokens a single process gives (greedy and
seeded), whether the session is named by the header or only in the body
(routed without affinity, and counted). Each replica's own metrics endpoint
parses. The local cluster listens on 127.0.0.1 only."""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from starlette.testclient import TestClient

from oxillama.model.paths import default_model_path
from oxillama.serving.http.app_spec import AppSpec
from oxillama.serving.ray.deployment import deployment
from oxillama.serving.ray.options import RayOptions
from oxillama.serving.ray.run import init_ray

TURNS = [" Tell me about the sea.", " And the mountains?", " Which is older?"]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 12}
SEEDED: dict[str, Any] = {"temperature": 0.9, "seed": 7, "max_tokens": 12}
MODEL = default_model_path().stem


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(folder: Path | None) -> AppSpec:
    return AppSpec(
        str(default_model_path()),
        threads=1,
        context_size=512,
        sessions_dir=None if folder is None else str(folder),
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    store = tmp_path_factory.mktemp("store")
    port = _port()
    init_ray(None, "127.0.0.1", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            deployment(_spec(store), RayOptions(replicas=2, drain_seconds=10)),
            name="oxillama",
            route_prefix="/",
        )
        yield f"http://127.0.0.1:{port}", store
    finally:
        serve.shutdown()
        ray.shutdown()


def _client(url: str) -> openai.OpenAI:
    # No retries: a turn that fails must show, not be hidden by a retry.
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _turn(
    client: openai.OpenAI, sid: str, i: int, sampling: dict[str, Any], naming: str = "header"
) -> tuple[str, str]:
    """Turn ``i`` of session ``sid``, named by the ``X-Session-Id`` header or
    only by the body's ``session`` (as against a lone `oxillama serve`)."""
    named: dict[str, Any] = (
        {"extra_headers": {"X-Session-Id": sid}}
        if naming == "header"
        else {"extra_body": {"session": sid}}
    )
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=TURNS[i], **named, **sampling
    )
    replica = raw.headers["x-oxillama-replica"]
    return raw.parse().choices[0].text, replica


def _reference(sid: str, sampling: dict[str, Any], turns: list[str] = TURNS) -> list[str]:
    """The turns in one process (no Ray, no store)."""
    with TestClient(_spec(None).build()) as c:
        out = []
        for prompt in turns:
            body = {"model": MODEL, "prompt": prompt, "session": sid, **sampling}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0]["text"])
        return out


def _actor(replica: str) -> Any:
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].endswith("#" + replica):
            return ray.get_actor(a["name"], namespace=a["namespace"])
    raise AssertionError(f"no actor for replica {replica}")


def _running_replicas(n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app = serve.status().applications.get("oxillama")
        if app is not None:
            dep = app.deployments["oxillama"]
            # The controller reports a killed replica running for a moment
            # after its actor is gone; the actor list is the truth.
            running = dep.status == "HEALTHY" and dep.replica_states.get("RUNNING", 0) == n
            if running and len(_replica_ids()) == n:
                return
        time.sleep(0.2)
    raise AssertionError(f"the deployment did not get back to {n} running replicas")


def test_requests_without_a_session_use_both_replicas(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    _running_replicas(2)
    client = _client(url)
    seen: set[str] = set()
    # A replica that has just replaced a killed one reaches the proxy's
    # router a moment after the controller reports it running.
    for _ in range(60):
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt="Hello", max_tokens=2, temperature=0
        )
        seen.add(raw.headers["x-oxillama-replica"])
        if len(seen) == 2:
            break
        time.sleep(0.1)
    assert len(seen) == 2


def test_each_replica_serves_its_metrics(cluster: tuple[str, Path]) -> None:
    _, store = cluster
    _running_replicas(2)
    targets = sorted((store / "metrics-targets").glob("*.json"))
    live = {r["replica_id"] for r in _replica_ids()}
    seen = 0
    for path in targets:
        if path.stem not in live:
            continue  # a killed replica's file stays (docs/deploy.md)
        target = json.loads(path.read_text())[0]["targets"][0]
        text = httpx.get(f"http://{target}/metrics", timeout=10).text
        kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
        assert kinds["oxillama:e2e_request_latency_seconds"] == "histogram"
        assert kinds["oxillama:generation_tokens"] == "counter"
        assert kinds["oxillama:kv_pages_free"] == "gauge"
        seen += 1
    assert seen == 2


def test_request_ids_pass_through_once(cluster: tuple[str, Path]) -> None:
    url, _ = cluster
    body = {"prompt": "Hi", "max_tokens": 2}
    r = httpx.post(url + "/v1/completions", json=body, headers={"X-Request-Id": "req-42"})
    assert r.status_code == 200, r.text
    assert r.headers.get_list("x-request-id") == ["req-42"]


def _without_affinity(target: str) -> float:
    """The lost-affinity counter of the replica whose metrics are at ``target``."""
    text = httpx.get(f"http://{target}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "oxillama:session_requests_without_affinity":
            assert family.type == "counter"
            return float(family.samples[0].value)
    raise AssertionError(f"no lost-affinity counter at {target}")


def _metrics_target(store: Path, replica: str) -> str:
    path = store / "metrics-targets" / f"{replica}.json"
    return str(json.loads(path.read_text())[0]["targets"][0])


@pytest.mark.parametrize("naming", ["header", "body"])
@pytest.mark.parametrize(("name", "sampling"), [("greedy", GREEDY), ("seeded", SEEDED)])
def test_session_survives_the_kill_of_its_replica(
    cluster: tuple[str, Path], name: str, sampling: dict[str, Any], naming: str
) -> None:
    """Named by the header, a session's turns stay on one replica; named in
    the body only, each turn goes to the least loaded replica, which
    restores the session from the store where it is not live. Either way
    the replica of turn 2 is killed and turn 3, on the other, is exact."""
    url, store = cluster
    _running_replicas(2)
    want = _reference(f"ref-{name}", sampling)
    client = _client(url)
    sid = f"ray-{name}-{naming}"
    t1, first = _turn(client, sid, 0, sampling, naming)
    t2, home = _turn(client, sid, 1, sampling, naming)
    if naming == "header":
        assert home == first, "a session's turns stay on the replica that holds it"
    assert (store / f"{sid}.oxisnap").is_file()
    ray.kill(_actor(home), no_restart=True)
    t3, other = _turn(client, sid, 2, sampling, naming)
    assert other != home
    assert [t1, t2, t3] == want


def _without_affinity_total(store: Path) -> float:
    """The lost-affinity counters of the live replicas, added up."""
    live = [r["replica_id"] for r in _replica_ids()]
    assert len(live) == 2
    return sum(_without_affinity(_metrics_target(store, r)) for r in live)


def test_a_session_named_in_the_body_only_is_served_and_counted(
    cluster: tuple[str, Path],
) -> None:
    """What `oxillama serve` accepts, Ray Serve does: a chat turn naming its
    session in the body only is a 200 (from the least loaded replica), and
    the lost-affinity counters go up by one; named by the header, or with
    no session, they do not. Header and body that differ are still a 400."""
    url, store = cluster
    _running_replicas(2)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}

    def post(body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)

    before = _without_affinity_total(store)
    r = post({**chat, "session": "abc"})
    assert r.status_code == 200, r.text
    assert _without_affinity_total(store) == before + 1
    for named in (post(chat, {"X-Session-Id": "abc"}), post(chat)):
        assert named.status_code == 200, named.text
    assert _without_affinity_total(store) == before + 1
    differ = post({**chat, "session": "abc"}, {"X-Session-Id": "xyz"})
    assert differ.status_code == 400
    assert differ.json()["error"]["param"] == "session"


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone since the listing
        # The command name is in parentheses and may hold spaces.
        children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    out, todo = {root}, [root]
    while todo:
        for child in children[todo.pop()]:
            out.add(child)
            todo.append(child)
    return out


def _proc_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _listening(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, command) of every TCP socket ``pids`` listen on."""
    owner: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    owner[link[8:-1]] = pid
        except OSError:
            continue  # gone, or an fd closed while read
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            listen, inode = fields[3] == "0A", fields[9]
            if listen and inode in owner:
                host, port = fields[1].split(":")
                command = Path(f"/proc/{owner[inode]}/comm").read_text().strip()
                out.append((str(_proc_address(host)), int(port, 16), command))
    return out


def test_the_local_cluster_listens_on_loopback_only(cluster: tuple[str, Path]) -> None:
    """Every TCP port the cluster's processes listen on (GCS, raylet,
    agents, the Serve proxy and controller, the replicas and their metrics
    endpoints, this driver) is on 127.0.0.1: the node's address is
    127.0.0.1, and Ray's processes are this one's descendants."""
    url, store = cluster
    _running_replicas(2)
    assert [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]] == ["127.0.0.1"]
    sockets = _listening(_descendants(os.getpid()))
    commands = {command for _, _, command in sockets}
    assert {"gcs_server", "raylet"} <= commands, sockets
    ports = {port for _, port, _ in sockets}
    assert int(url.rsplit(":", 1)[1]) in ports, "the Serve proxy is among them"
    for replica in _replica_ids():
        host, port = _metrics_target(store, replica["replica_id"]).rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) in ports, "each replica's metrics endpoint is among them"
    outside = [s for s in sockets if not ipaddress.ip_address(s[0]).is_loopback]
    assert not outside, f"listening beyond 127.0.0.1: {outside}"


def test_a_turn_in_flight_is_the_only_loss(cluster: tuple[str, Path]) -> None:
    """The replica dies while it streams turn 2: the client's stream breaks
    (an error, not a hang), and turn 3 continues from the end of turn 1 on
    the other replica, exactly."""
    url, _ = cluster
    _running_replicas(2)
    want = _reference("ref-lost", GREEDY, [TURNS[0], TURNS[2]])
    client = _client(url)
    sid = "lost"
    t1, home = _turn(client, sid, 0, GREEDY)
    body = {"prompt": TURNS[1], "max_tokens": 400, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    with pytest.raises(httpx.HTTPError):
        with httpx.stream(
            "POST", url + "/v1/completions", json=body, headers={"X-Session-Id": sid}, timeout=60
        ) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            ray.kill(_actor(home), no_restart=True)
            for _ in lines:
                pass
    assert time.monotonic() - t0 < 30
    t3, other = _turn(client, sid, 2, GREEDY)
    assert other != home
    assert [t1, t3] == want


def _replica_ids() -> list[dict[str, str]]:
    out = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["name"].startswith("SERVE_REPLICA::"):
            out.append({"replica_id": a["name"].rsplit("#", 1)[-1]})
    return out


def test_deleting_the_app_stops_every_replica_gracefully(cluster: tuple[str, Path]) -> None:
    """Last in this file: Ray Serve stops the replicas (as on scale-down or
    `serve shutdown`); each drains, saves its live sessions and removes its
    metrics target."""
    url, store = cluster
    _running_replicas(2)
    _turn(_client(url), "drained", 0, GREEDY)
    live = {r["replica_id"] for r in _replica_ids()}
    assert all((store / "metrics-targets" / f"{r}.json").is_file() for r in live)
    serve.delete("oxillama")
    assert not any((store / "metrics-targets" / f"{r}.json").exists() for r in live)
    assert (store / "drained.oxisnap").is_file()
