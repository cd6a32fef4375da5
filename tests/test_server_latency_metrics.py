"""``/metrics``: every family from ``prometheus_client`` in the app's one
registry, parsed with its own parser; each family exists with its type;
over completions, chat, streaming and a stateful session with every save
and restore path, counters never decrease between scrapes and the ones that
should grow do; the latency histograms count exactly the generation
requests made; a drain's saves show in ``Server.metrics_exposition()``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from oxillama import AsyncEngine
from oxillama.serving.http import build_app
from oxillama.serving.http.limits import Limits
from tests._serve import serving_app

HISTOGRAMS = {
    "oxillama:time_to_first_token_seconds",
    "oxillama:inter_token_latency_seconds",
    "oxillama:e2e_request_latency_seconds",
    "oxillama:request_queue_time_seconds",
    "oxillama:request_prompt_tokens",
}
#: Family (as the parser names it: a counter without ``_total``) -> type.
FAMILIES = {
    **dict.fromkeys(HISTOGRAMS, "histogram"),
    **dict.fromkeys(
        [
            "oxillama:http_requests",
            "oxillama:request_success",
            "oxillama:prompt_tokens",
            "oxillama:generation_tokens",
            "oxillama:num_preemptions",
            "oxillama:session_saves",
            "oxillama:session_restores",
            "oxillama:prefix_cache_queries",
            "oxillama:prefix_cache_hits",
            # What the old renderer also exported, renamed.
            "oxillama:decode_steps",
            "oxillama:prefill_seconds",
            "oxillama:decode_seconds",
            "oxillama:requests_finished",
            "oxillama:requests_cancelled",
            "oxillama:session_turns",
            "oxillama:sessions_created",
            "oxillama:session_evictions",
            "oxillama:spec_decode_num_draft_tokens",
        ],
        "counter",
    ),
    **dict.fromkeys(
        [
            "oxillama:num_requests_running",
            "oxillama:num_requests_waiting",
            "oxillama:kv_pages_used",
            "oxillama:kv_pages_free",
            "oxillama:kv_cache_usage_perc",
            "oxillama:sessions_live",
            "oxillama:sessions_hibernated",
            "oxillama:prefix_cache_hit_ratio",
            "oxillama:kv_page_bytes",
        ],
        "gauge",
    ),
}

Scrape = dict[str, tuple[str, dict[str, float]]]


def _parse(text: str) -> Scrape:
    """Family name -> (type, {sample name + labels: value})."""
    out: Scrape = {}
    for fam in text_string_to_metric_families(text):
        samples = {s.name + repr(sorted(s.labels.items())): float(s.value) for s in fam.samples}
        out[fam.name] = (fam.type, samples)
    return out


def _scrape(url: str) -> Scrape:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE_LATEST
    return _parse(r.text)


def _value(m: Scrape, family: str, **labels: str) -> float:
    kind, samples = m[family]
    name = family + ("_total" if kind == "counter" else "")
    return samples.get(name + repr(sorted(labels.items())), 0.0)


def _only_grew(before: Scrape, after: Scrape) -> None:
    for name, (kind, samples) in before.items():
        if kind != "counter":
            continue
        for key, value in samples.items():
            assert after[name][1].get(key, value) >= value, (name, key)


def _requests(url: str, n: int) -> None:
    base = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    for i in range(n):
        if i % 3 == 2:
            msgs = [{"role": "user", "content": f"Say {i}"}]
            r = httpx.post(url + "/v1/chat/completions", json={**base, "messages": msgs})
            assert r.status_code == 200
        elif i % 3 == 1:
            body = {**base, "prompt": f"Count {i}:", "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body) as s:
                assert s.status_code == 200
                for _ in s.iter_lines():
                    pass
        else:
            # Long enough for whole prefix-cache blocks: the second one hits.
            prompt = "The lighthouse keeper climbed the stairs every night. " * 4
            r = httpx.post(url + "/v1/completions", json={**base, "prompt": prompt})
            assert r.status_code == 200


def _turn(url: str, sid: str) -> None:
    body = {"prompt": " and then", "max_tokens": 3, "ignore_eos": True, "session": sid}
    r = httpx.post(url + "/v1/completions", json={**body, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text


def test_every_family_counters_only_grow_and_histograms_count_requests(
    model_path: Path, tmp_path: Path
) -> None:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=4)
    limits = Limits(max_sessions=2, persist_turns=True)
    app = build_app(engine, model_name="smollm2", sessions_dir=tmp_path, limits=limits)
    with serving_app(app, engine) as url:
        first = _scrape(url)
        for name, kind in FAMILIES.items():
            assert first.get(name, ("missing",))[0] == kind, name

        # Stateless requests (one of them refused).
        _requests(url, 6)
        assert httpx.post(url + "/v1/completions", json={"prompt": 5}).status_code == 400
        plain = _scrape(url)
        _only_grew(first, plain)

        def grew(family: str, m0: Scrape, m1: Scrape, **labels: str) -> float:
            return _value(m1, family, **labels) - _value(m0, family, **labels)

        def answered(route: str, status: str) -> float:
            return grew("oxillama:http_requests", first, plain, route=route, status=status)

        assert answered("/v1/completions", "200") == 4
        assert answered("/v1/chat/completions", "200") == 2
        assert answered("/v1/completions", "400") == 1
        assert grew("oxillama:generation_tokens", first, plain) == 6 * 4
        assert grew("oxillama:prompt_tokens", first, plain) > 0
        assert grew("oxillama:request_success", first, plain, finished_reason="length") == 6
        assert grew("oxillama:prefix_cache_queries", first, plain) >= 1
        assert grew("oxillama:prefix_cache_hits", first, plain) >= 1
        assert 0 < _value(plain, "oxillama:prefix_cache_hit_ratio") <= 1
        assert _value(plain, "oxillama:num_requests_running") == 0
        assert _value(plain, "oxillama:num_requests_waiting") == 0
        pages = _value(plain, "oxillama:kv_pages_used") + _value(plain, "oxillama:kv_pages_free")
        assert pages == engine.metrics()["kv_pages_total"]

        # A stateful session through every save and restore path.
        def saves(m: Scrape, reason: str) -> float:
            return _value(m, "oxillama:session_saves", reason=reason)

        def restores(m: Scrape, reason: str) -> float:
            return _value(m, "oxillama:session_restores", reason=reason)

        _turn(url, "s1")  # created; the turn's snapshot: a "turn" save
        _turn(url, "s1")
        assert httpx.post(url + "/v1/sessions/s1/save").status_code == 200
        assert httpx.post(url + "/v1/sessions/s1/restore").status_code == 200
        # Neither this server's explicit save nor its restore makes the file
        # look newer than the live session: no "stale" read here.
        _turn(url, "s1")
        saved = _scrape(url)
        _only_grew(plain, saved)
        assert saves(saved, "turn") == 3 and saves(saved, "explicit") == 1
        assert restores(saved, "explicit") == 1 and restores(saved, "stale") == 0
        assert _value(saved, "oxillama:sessions_created") == 1
        assert _value(saved, "oxillama:sessions_live") == 1
        assert grew("oxillama:session_turns", plain, saved) == 3

        # Another writer (as another replica would): the next turn reads it.
        snap = tmp_path / "s1.oxisnap"
        st = snap.stat()
        os.utime(snap, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        _turn(url, "s1")
        # Past max_sessions=2 the least recently used idle session hibernates.
        _turn(url, "s2")
        _turn(url, "s3")  # s1 hibernates
        _turn(url, "s1")  # s1 wakes, s2 hibernates
        # A file this process never wrote (an earlier run, another replica).
        shutil.copy(snap, tmp_path / "s9.oxisnap")
        _turn(url, "s9")  # s3 hibernates
        moved = _scrape(url)
        _only_grew(saved, moved)
        assert restores(moved, "stale") == 1
        assert restores(moved, "wake") == 1
        assert restores(moved, "adopt") == 1
        assert saves(moved, "hibernate") == 3
        assert saves(moved, "turn") == 3 + 5
        assert _value(moved, "oxillama:sessions_live") == 2
        assert _value(moved, "oxillama:sessions_hibernated") == 2  # s2, s3
        assert _value(moved, "oxillama:sessions_created") == 3

        # Every generation request (6 stateless, 8 session turns) is in
        # every histogram exactly once; the refused one is in none.
        requests = 6 + 8
        for name in HISTOGRAMS:
            samples = moved[name][1]
            count = samples[f"{name}_count[]"] - first[name][1][f"{name}_count[]"]
            assert count == requests, (name, count)
            # Cumulative buckets end at the count.
            assert samples[f"{name}_bucket[('le', '+Inf')]"] == samples[f"{name}_count[]"]
        assert grew("oxillama:request_success", first, moved, finished_reason="length") == requests
        assert moved["oxillama:request_prompt_tokens"][1]["oxillama:request_prompt_tokens_sum[]"]
    # The graceful stop saved both live sessions (s1, s9): the same text
    # /metrics served, from the Server, for another port to serve.
    server: Any = app.state.server
    drained = _parse(server.metrics_exposition().decode())
    _only_grew(moved, drained)
    assert saves(drained, "drain") == 2


def test_route_labels_are_templates_never_ids() -> None:
    from oxillama.serving.http.latency_metrics import route_label

    assert route_label("/v1/completions") == "/v1/completions"
    assert route_label("/v1/sessions/user-42/save") == "/v1/sessions/{sid}/save"
    assert route_label("/v1/sessions/x/restore") == "/v1/sessions/{sid}/restore"
    assert route_label("/v1/sessions/x/delete") == route_label("/no/such") == "other"


def test_an_unknown_engine_key_is_a_gauge_and_the_prefix_families_always_exist() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from oxillama.serving.http.metrics import ServerCollector

    registry = CollectorRegistry()
    # A recurrent model's engine: no prefix cache keys at all.
    m = {"prompt_tokens": 7, "preempted": 2, "session_swaps": 1, "brand_new": 3.5}
    registry.register(ServerCollector(lambda: m))
    got = _parse(generate_latest(registry).decode())
    assert _value(got, "oxillama:prompt_tokens") == 7
    assert _value(got, "oxillama:brand_new") == 3.5 and got["oxillama:brand_new"][0] == "gauge"
    assert _value(got, "oxillama:num_preemptions", mode="recompute") == 2
    assert _value(got, "oxillama:num_preemptions", mode="swap") == 1
    for name, kind in (
        ("oxillama:prefix_cache_queries", "counter"),
        ("oxillama:prefix_cache_hits", "counter"),
        ("oxillama:prefix_cache_hit_ratio", "gauge"),
    ):
        assert got[name][0] == kind and _value(got, name) == 0, name
