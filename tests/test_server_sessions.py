"""The server's bounded session table: past --max-sessions the least
recently used idle session is hibernated to the sessions folder and comes
back exactly on its next request, or, without a folder, is evicted and
answered with a 404 saying why; a restarted server restores what was saved
or hibernated; a session in a turn is never picked; a full table of busy
sessions answers 503; two requests for one session never race."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from oxillama import AsyncEngine
from oxillama.serving.http import Limits
from tests._serve import serving

MODEL = "smollm2"


@contextmanager
def server(model_path: Path, **options: Any) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=4)
    with serving(engine, MODEL, **options) as url:
        yield url


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def turn(url: str, sid: str, body: dict[str, Any]) -> str:
    status, out = post(url + "/v1/completions", {**body, "session": sid})
    assert status == 200, out
    return str(out["choices"][0]["text"])


def metrics(url: str) -> dict[str, float]:
    """Sample name without the prefix (labels kept) -> value."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {k.removeprefix("oxillama:"): float(v) for k, v in pairs}


FIRST = {"prompt": "The lighthouse keeper", "max_tokens": 5, "ignore_eos": True, "seed": 5}
SECOND = {**FIRST, "prompt": " Then,", "max_tokens": 8}


def test_without_a_folder_idle_sessions_are_evicted_with_a_404_that_says_why(
    model_path: Path,
) -> None:
    with server(model_path, limits=Limits(max_sessions=2, remembered_evictions=2)) as url:
        for sid in ("e0", "e1", "e2"):
            turn(url, sid, FIRST)
        status, out = post(url + "/v1/completions", {**SECOND, "session": "e0"})
        assert status == 404 and out["error"]["code"] == "session_evicted"
        msg = out["error"]["message"]
        assert "at most 2 live sessions" in msg and "--sessions-dir" in msg
        turn(url, "e2", SECOND)  # the others carry on
        m = metrics(url)
        assert m["session_evictions_total"] == 1 and m["sessions_live"] == 2
        # Evicted ids are remembered in a bounded structure: the oldest is
        # forgotten, and its id starts a new session.
        for sid in ("e3", "e4", "e5"):
            turn(url, sid, FIRST)
        assert post(url + "/v1/completions", {**FIRST, "session": "e0"})[0] == 200
        assert post(url + "/v1/completions", {**FIRST, "session": "e4"})[0] == 404
        status, out = post(url + "/v1/sessions/e5/save", {})
        assert status == 400 and "--sessions-dir" in out["error"]["message"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_hibernated_session_continues_exactly_as_one_that_stayed(
    model_path: Path, tmp_path: Path, temperature: float
) -> None:
    first, second = {**FIRST, "temperature": temperature}, {**SECOND, "temperature": temperature}
    with server(model_path, sessions_dir=tmp_path, limits=Limits(max_sessions=2)) as url:
        turn(url, "away", first)
        turn(url, "stay", first)
        turn(url, "other", first)  # the least recently used, "away", leaves
        assert (tmp_path / "away.oxisnap").is_file()
        m = metrics(url)
        assert m['session_saves_total{reason="hibernate"}'] == 1
        assert m["sessions_hibernated"] == 1
        want = turn(url, "stay", second)
        got = turn(url, "away", second)  # restored from disk ("other" leaves)
        m = metrics(url)
        assert m['session_restores_total{reason="wake"}'] == 1 and m["sessions_live"] == 2
    assert got == want


def test_a_restarted_server_restores_saved_and_hibernated_sessions(
    model_path: Path, tmp_path: Path
) -> None:
    limits = Limits(max_sessions=1)
    with server(model_path, sessions_dir=tmp_path, limits=limits) as url:
        turn(url, "saved", FIRST)
        status, out = post(url + "/v1/sessions/saved/save", {})
        assert status == 200 and out["path"] == "saved.oxisnap"
        turn(url, "slept", FIRST)  # "saved" hibernates: max_sessions is 1
        turn(url, "pusher", FIRST)  # and now "slept" does
    assert {p.name for p in tmp_path.iterdir()} >= {"saved.oxisnap", "slept.oxisnap"}
    with server(model_path, sessions_dir=tmp_path, limits=Limits(max_sessions=4)) as url:
        turn(url, "ref", FIRST)
        want = turn(url, "ref", SECOND)
        assert turn(url, "saved", SECOND) == want
        assert turn(url, "slept", SECOND) == want
        # Files an earlier run wrote (one saved, one hibernated).
        assert metrics(url)['session_restores_total{reason="adopt"}'] == 2


def test_a_session_in_a_turn_is_never_picked_and_a_full_busy_table_answers_503(
    model_path: Path, tmp_path: Path
) -> None:
    long_turn = {"prompt": "Count:", "max_tokens": 32, "ignore_eos": True, "stream": True}
    with server(model_path, sessions_dir=tmp_path, limits=Limits(max_sessions=2)) as url:
        req = urllib.request.Request(
            url + "/v1/completions",
            json.dumps({**long_turn, "session": "busy"}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as stream:
            assert stream.readline().startswith(b"data: ")  # its turn is running
            turn(url, "idle", FIRST)
            turn(url, "new", FIRST)  # "busy" is older, but in a turn: "idle" leaves
            assert (tmp_path / "idle.oxisnap").is_file()
            assert not (tmp_path / "busy.oxisnap").exists()
            rest = stream.read().decode()
        assert rest.rstrip().endswith("data: [DONE]")
    with server(model_path, limits=Limits(max_sessions=1)) as url:
        req = urllib.request.Request(
            url + "/v1/completions",
            json.dumps({**long_turn, "session": "busy"}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as stream:
            stream.readline()
            try:
                urllib.request.urlopen(
                    urllib.request.Request(
                        url + "/v1/completions",
                        json.dumps({**FIRST, "session": "late"}).encode(),
                        {"Content-Type": "application/json"},
                    ),
                    timeout=60,
                )
                raise AssertionError("a full table of busy sessions must answer 503")
            except urllib.error.HTTPError as e:
                assert e.code == 503 and e.headers["Retry-After"] == "1"
                assert json.loads(e.read())["error"]["code"] == "sessions_busy"
            stream.read()
        turn(url, "late", FIRST)  # "busy" is idle now, and leaves


def test_two_requests_for_one_session_do_not_race(model_path: Path, tmp_path: Path) -> None:
    bodies = [
        {"prompt": [504, 3458], "max_tokens": 6, "ignore_eos": True, "temperature": 0},
        {"prompt": [1000], "max_tokens": 5, "ignore_eos": True, "temperature": 0},
    ]
    with server(model_path, sessions_dir=tmp_path, limits=Limits(max_sessions=2)) as url:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda b: turn(url, "both", b), bodies))
        for b in bodies:
            turn(url, "one-by-one", b)
        both = post(url + "/v1/sessions/both/save", {})[1]
        sequential = post(url + "/v1/sessions/one-by-one/save", {})[1]
    assert both["tokens"] == sequential["tokens"] == 2 + 6 + 1 + 5


def test_a_client_hanging_up_mid_stream_frees_its_session(model_path: Path) -> None:
    body = {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with server(model_path, limits=Limits(max_sessions=1)) as url:
        req = urllib.request.Request(
            url + "/v1/completions",
            json.dumps({**body, "session": "gone"}).encode(),
            {"Content-Type": "application/json"},
        )
        resp = urllib.request.urlopen(req, timeout=60)
        assert resp.readline().startswith(b"data: ")
        resp.close()  # hang up mid-turn
        for _ in range(200):
            if metrics(url).get("requests_cancelled_total", 0) >= 1:
                break
            time.sleep(0.05)
        # The turn was cancelled long before its 200 tokens, and the session
        # is free: the next turn runs, then it is idle and leaves for "next".
        assert metrics(url)["generation_tokens_total"] < 150
        turn(url, "gone", FIRST)
        turn(url, "next", FIRST)
        assert metrics(url)["session_evictions_total"] == 1
