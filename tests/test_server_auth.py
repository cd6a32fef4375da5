"""API keys on the server, through the official `openai` client: 401 in
OpenAI's shape without a key or with a wrong one, 200 with any configured
key; /health open, /metrics open unless metrics_auth; every key compared
(constant time, no early exit); where keys come from."""

from __future__ import annotations

import hmac
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import openai
import pytest

from oxillama import AsyncEngine, ParameterError
from oxillama.serving.http import load_api_keys
from oxillama.serving.http.auth import ApiKeys
from tests._serve import serving

MODEL = "smollm2"
KEYS = ("sk-first-0123456789", "sk-second-abcdefghij")


@pytest.fixture(scope="module")
def base_url(model_path: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=128, threads=2, max_batch=4)
    with serving(engine, MODEL, api_keys=KEYS, metrics_auth=True) as url:
        yield url


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Message, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_openai_client_gets_401_without_the_right_key_and_200_with_it(base_url: str) -> None:
    with pytest.raises(openai.AuthenticationError) as wrong:
        client(base_url, "sk-not-a-key").completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert wrong.value.status_code == 401
    body = wrong.value.body
    assert isinstance(body, dict)
    assert body["code"] == "invalid_api_key" and body["type"] == "invalid_request_error"
    assert "sk-not-a-key" not in json.dumps(body)
    for key in KEYS:
        c = client(base_url, key)
        assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text
        assert [m.id for m in c.models.list().data] == [MODEL]
        r = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert r.choices[0].message.content is not None


def test_missing_key_gets_openai_error_and_www_authenticate(base_url: str) -> None:
    for path in ("/v1/models", "/v1/completions", "/v1/sessions/x/save", "/v1/nothing"):
        status, headers, raw = get(base_url + path)
        assert status == 401, path
        assert str(headers["WWW-Authenticate"]).startswith("Bearer")
        err = json.loads(raw)["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == "invalid_api_key" and "Authorization: Bearer" in err["message"]
    # Not a bearer token, or a key in another scheme: refused too.
    for value in (f"Basic {KEYS[0]}", KEYS[0], "Bearer ", f"Bearer {KEYS[0]}x"):
        assert get(base_url + "/v1/models", {"Authorization": value})[0] == 401


def test_health_is_open_and_metrics_needs_a_key_with_metrics_auth(base_url: str) -> None:
    assert get(base_url + "/health")[0] == 200
    assert get(base_url + "/metrics")[0] == 401
    status, _, text = get(base_url + "/metrics", {"Authorization": f"Bearer {KEYS[1]}"})
    assert status == 200 and b"oxillama:http_requests_total" in text


def test_metrics_stay_open_without_metrics_auth(model_path: Path) -> None:
    engine = AsyncEngine(model_path, context_size=64, threads=1, max_batch=1)
    with serving(engine, MODEL, api_keys=KEYS[:1]) as url:
        assert get(url + "/metrics")[0] == 200
        assert get(url + "/v1/models")[0] == 401


def test_every_key_is_compared_without_early_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(real(a, b))
        return calls[-1]

    monkeypatch.setattr(hmac, "compare_digest", counting)
    keys = ApiKeys(["k-one", "k-two", "k-three"])
    assert keys.accepts(b"k-one") and calls == [True, False, False]
    calls.clear()
    assert not keys.accepts(b"k-on") and calls == [False, False, False]


def test_keys_come_from_flags_file_and_environment(tmp_path: Path) -> None:
    f = tmp_path / "keys.txt"
    f.write_text("# team keys\n\n  sk-file-1  \nsk-file-2\n# sk-commented-out\nsk-flag\n")
    keys = load_api_keys(["sk-flag"], f, env={"OXILLAMA_API_KEY": "sk-env"})
    assert keys == ("sk-flag", "sk-file-1", "sk-file-2", "sk-env")
    assert load_api_keys([], None, env={}) == ()
    f.write_text("sk-ok\nsk with space\n")
    with pytest.raises(ParameterError, match="line 2") as bad:
        load_api_keys([], f, env={})
    assert "with space" not in str(bad.value)  # where the key is, never the key
    with pytest.raises(ParameterError, match="cannot read"):
        load_api_keys([], tmp_path / "missing.txt", env={})
    with pytest.raises(ParameterError, match="empty"):
        load_api_keys([""], None, env={})
