"""``/metrics`` parses with ``prometheus_client``'s own parser; the latency
histograms count exactly the requests that completed; counters only grow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from oxillama import AsyncEngine
from tests._serve import serving

HISTOGRAMS = {
    "oxillama:time_to_first_token_seconds",
    "oxillama:inter_token_latency_seconds",
    "oxillama:e2e_request_latency_seconds",
    "oxillama:request_queue_time_seconds",
    "oxillama:request_prompt_tokens",
}


@pytest.fixture(scope="module")
def url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=256, threads=2, max_batch=4)
    with serving(engine, "smollm2") as u:
        yield u


def _scrape(url: str) -> dict[str, tuple[str, dict[str, float]]]:
    """Family name -> (type, {sample name + labels: value})."""
    text = httpx.get(url + "/metrics").text
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for fam in text_string_to_metric_families(text):
        samples = {s.name + repr(sorted(s.labels.items())): float(s.value) for s in fam.samples}
        out[fam.name] = (fam.type, samples)
    return out


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
            r = httpx.post(url + "/v1/completions", json={**base, "prompt": f"Item {i}:"})
            assert r.status_code == 200


def test_histograms_count_every_request_and_counters_only_grow(url: str) -> None:
    before = _scrape(url)
    for name in HISTOGRAMS:
        assert before[name][0] == "histogram", name
    _requests(url, 6)
    # An invalid body is not a completed request: no histogram moves for it.
    assert httpx.post(url + "/v1/completions", json={"prompt": 5}).status_code == 400
    after = _scrape(url)
    for name in HISTOGRAMS:
        kind, samples = after[name]
        count = samples[f"{name}_count[]"] - before[name][1][f"{name}_count[]"]
        assert count == 6, (name, count)
        # Cumulative buckets end at the count.
        assert samples[f"{name}_bucket[('le', '+Inf')]"] == samples[f"{name}_count[]"]
    prompts = after["oxillama:request_prompt_tokens"][1]
    assert prompts["oxillama:request_prompt_tokens_sum[]"] > 0
    # Every counter family only grew (or stayed).
    for name, (kind, samples) in before.items():
        if kind != "counter":
            continue
        for key, value in samples.items():
            assert after[name][1].get(key, value) >= value, (name, key)
    routes = after["oxillama:http_requests"]
    assert routes[0] == "counter"

    def answered(route: str, status: str) -> float:
        key = f"oxillama:http_requests_total[('route', '{route}'), ('status', '{status}')]"
        old = before["oxillama:http_requests"][1].get(key, 0.0)
        return routes[1].get(key, 0.0) - old

    assert answered("/v1/completions", "200") == 4
    assert answered("/v1/chat/completions", "200") == 2
    assert answered("/v1/completions", "400") == 1
    generated = [v for k, v in after["oxillama_generated_tokens"][1].items()]
    assert generated and generated[0] >= 6 * 4


def test_route_labels_are_templates_never_ids() -> None:
    from oxillama.server.latency_metrics import route_label

    assert route_label("/v1/completions") == "/v1/completions"
    assert route_label("/v1/sessions/user-42/save") == "/v1/sessions/{sid}/save"
    assert route_label("/v1/sessions/x/restore") == "/v1/sessions/{sid}/restore"
    assert route_label("/v1/sessions/x/delete") == route_label("/no/such") == "other"
