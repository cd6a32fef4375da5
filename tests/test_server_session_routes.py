"""The routes under the chat page: a session's notes (title, messages,
settings) written, read, listed and deleted, with and without a sessions
folder; a fork continuing exactly as its source's history would; export
and import of snapshot files; their errors; and the page itself at ``/``
(its Content-Security-Policy, ``--no-webui``, no key needed for it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from oxillama import AsyncEngine
from oxillama.serving.http import build_app
from tests._serve import serving

MODEL = "smollm2"
GREEDY = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sessions")


@pytest.fixture(scope="module")
def url(model_path: Path, folder: Path) -> Iterator[str]:
    engine = AsyncEngine(model_path, context_size=512, threads=2, max_batch=2)
    with serving(engine, MODEL, sessions_dir=folder) as u:
        yield u


def call(method: str, url: str, **kwargs: Any) -> tuple[int, Any]:
    r = httpx.request(method, url, timeout=60, **kwargs)
    kind = r.headers.get("content-type", "")
    return r.status_code, r.json() if kind.startswith("application/json") else r.content


def chat(url: str, messages: list[dict[str, str]], session: str | None = None) -> str:
    body: dict[str, Any] = {"messages": messages, **GREEDY}
    if session is not None:
        body["session"] = session
    status, out = call("POST", url + "/v1/chat/completions", json=body)
    assert status == 200, out
    return str(out["choices"][0]["message"]["content"])


def notes(title: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"title": title, "messages": messages, **extra}


def test_notes_are_written_listed_renamed_and_deleted(url: str, folder: Path) -> None:
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet", "stopped": True},
    ]
    settings = {"temperature": 0.5, "top_p": 0.9, "max_tokens": 64, "seed": 3, "json_mode": False}
    status, got = call("PUT", url + "/v1/sessions/n1", json=notes("One", msgs, settings=settings))
    assert status == 200, got
    assert got["messages"] == msgs and got["settings"] == settings and got["title"] == "One"
    assert got["live"] is False and got["saved"] is False and got["tokens"] is None
    # Beside the snapshot, in the shape `oxillama chat`'s /load reads.
    on_disk = json.loads((folder / "n1.oxisnap.chat.json").read_text())
    assert on_disk["messages"] == msgs
    call("PUT", url + "/v1/sessions/n1", json=notes("Renamed", msgs))
    status, listing = call("GET", url + "/v1/sessions")
    row = next(r for r in listing["data"] if r["id"] == "n1")
    assert row["title"] == "Renamed" and row["n_messages"] == 2
    status, out = call("DELETE", url + "/v1/sessions/n1")
    assert status == 200 and out == {"id": "n1", "deleted": True}
    assert not (folder / "n1.oxisnap.chat.json").exists()
    status, out = call("GET", url + "/v1/sessions/n1")
    assert status == 404 and "no session 'n1'" in out["error"]["message"]
    assert call("DELETE", url + "/v1/sessions/n1")[0] == 404


def test_sessions_of_any_client_are_listed(url: str) -> None:
    chat(url, [{"role": "user", "content": "Hello"}], session="api-client")
    status, listing = call("GET", url + "/v1/sessions")
    row = next(r for r in listing["data"] if r["id"] == "api-client")
    assert row["live"] and row["tokens"] > 0 and row["title"] is None
    call("POST", url + "/v1/sessions/api-client/save")
    status, row = call("GET", url + "/v1/sessions/api-client")
    assert row["saved"] and row["messages"] == []
    call("DELETE", url + "/v1/sessions/api-client")
    status, listing = call("GET", url + "/v1/sessions")
    assert status == 200
    assert "api-client" not in [r["id"] for r in listing["data"]]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (notes("t", [{"role": "tool", "content": "x"}]), "messages[0].role", "must be one of"),
        (notes("t", [{"role": "user", "content": "x", "name": "a"}]), "messages[0].name", ""),
        ({"messages": []}, "title", "is required"),
        (notes("", []), "title", "at least 1"),
        (notes("t", [], settings={"temperature": 3}), "settings.temperature", "at most 2"),
        (notes("t", [], settings={"mirostat": 1}), "settings.mirostat", "not a field"),
    ],
)
def test_bad_notes_are_refused_by_name(url: str, body: Any, param: str, words: str) -> None:
    status, out = call("PUT", url + "/v1/sessions/bad", json=body)
    assert status == 400, out
    message = out["error"]["message"]
    assert out["error"]["param"] == param.split(".")[0].split("[")[0]
    assert param in message and words in message, message
    assert call("GET", url + "/v1/sessions/bad")[0] == 404


def test_a_fork_continues_as_its_history_would(url: str) -> None:
    history = [{"role": "user", "content": "Name a color."}]
    history.append({"role": "assistant", "content": chat(url, history, session="src")})
    later = [*history, {"role": "user", "content": "Another?"}]
    later.append({"role": "assistant", "content": chat(url, later, session="src")})
    call("PUT", url + "/v1/sessions/src", json=notes("Colors", later))
    status, out = call(
        "POST", url + "/v1/sessions/src/fork", json=notes("Colors (fork)", history, id="dst")
    )
    assert status == 200, out
    # The source's state was copied, its later turn included.
    assert out["copied"] is True and out["id"] == "dst" and out["tokens"] > 0
    branch = [*history, {"role": "user", "content": "And a fruit?"}]
    assert chat(url, branch, session="dst") == chat(url, branch)
    # The source goes on as before.
    again = [*later, {"role": "user", "content": "One more."}]
    assert chat(url, again, session="src") == chat(url, again)
    status, got = call("GET", url + "/v1/sessions/dst")
    assert got["title"] == "Colors (fork)" and got["messages"] == history
    status, out = call("POST", url + "/v1/sessions/src/fork", json=notes("x", [], id="dst"))
    assert status == 409 and out["error"]["code"] == "session_exists"
    status, out = call("POST", url + "/v1/sessions/nowhere/fork", json=notes("x", []))
    assert status == 404
    # A session with notes only forks too: its first turn evaluates the history.
    call("PUT", url + "/v1/sessions/paper", json=notes("Paper", history))
    status, out = call("POST", url + "/v1/sessions/paper/fork", json=notes("P2", history))
    assert status == 200 and out["copied"] is False and out["id"].startswith("s")


def test_export_and_import(url: str) -> None:
    history = [{"role": "user", "content": "Name a tree."}]
    chat(url, history, session="tree")
    status, blob = call("GET", url + "/v1/sessions/tree/snapshot")
    assert status == 200 and blob[:8] == b"OXISNAP1"
    status, out = call(
        "PUT",
        url + "/v1/sessions/tree2/snapshot",
        content=blob,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert status == 200 and out["id"] == "tree2"
    assert out["tokens"] == call("GET", url + "/v1/sessions/tree")[1]["tokens"]
    nxt = [*history, {"role": "assistant", "content": "Oak."}, {"role": "user", "content": "Why?"}]
    assert chat(url, nxt, session="tree2") == chat(url, nxt, session="tree")
    status, out = call("PUT", url + "/v1/sessions/tree3/snapshot", content=b"not a snapshot")
    assert status == 400 and "cannot import the snapshot" in out["error"]["message"]
    status, out = call("PUT", url + "/v1/sessions/tree3/snapshot", content=b"")
    assert status == 400 and "empty" in out["error"]["message"]
    status, out = call("GET", url + "/v1/sessions/none/snapshot")
    assert status == 404


def test_info_and_the_page(url: str) -> None:
    status, info = call("GET", url + "/v1/info")
    assert status == 200
    assert info == {
        "model": MODEL,
        "arch": "llama",
        "n_ctx": 512,
        "kv_type": "f16",
        "reasoning": False,
        "sessions_dir": True,
    }
    r = httpx.get(url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert 'aria-label="Message"' in r.text
    for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css")]:
        r = httpx.get(f"{url}/webui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
    assert httpx.get(url + "/webui/secret.py").status_code == 404
    assert httpx.get(url + "/webui/..%2Fapp.py").status_code == 404


def test_no_webui_and_the_key(model_path: Path) -> None:
    engine = AsyncEngine(model_path, context_size=128, threads=2, max_batch=1)

    async def probe() -> None:
        for webui, keys in [(False, ()), (True, ("sk-1",))]:
            app = build_app(engine, model_name=MODEL, webui=webui, api_keys=keys)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
                page = await c.get("/")
                assert page.status_code == (200 if webui else 404)
                if keys:
                    # The page needs no key; what it calls does.
                    assert (await c.get("/v1/sessions")).status_code == 401
                    ok = await c.get("/v1/sessions", headers={"Authorization": "Bearer sk-1"})
                    assert ok.status_code == 200
        await engine.close()

    asyncio.run(probe())


def test_the_flag_turns_the_page_off() -> None:
    from oxillama.serving.flags import serve_options_from_mapping

    assert serve_options_from_mapping({"model": "m.gguf"})[0].webui is True
    for off in (False, "false", "0"):
        assert serve_options_from_mapping({"model": "m.gguf", "webui": off})[0].webui is False
    assert serve_options_from_mapping({"model": "m.gguf", "webui": "yes"})[0].webui is True


def test_the_folder_pair_loads_in_oxillama_chat(url: str, folder: Path, model_path: Path) -> None:
    import io

    from oxillama import Engine
    from oxillama.cli.chat_repl import ChatRepl

    history = [{"role": "user", "content": "Name a bird."}]
    history.append({"role": "assistant", "content": chat(url, history, session="bird")})
    call("PUT", url + "/v1/sessions/bird", json=notes("Birds", history))
    assert call("POST", url + "/v1/sessions/bird/save")[0] == 200
    # The folder holds bird.oxisnap and bird.oxisnap.chat.json: /save's pair.
    lines = iter([f"/load {folder / 'bird.oxisnap'}", "/bye"])
    out = io.StringIO()
    engine = Engine(model_path, context_size=512, threads=2)
    repl = ChatRepl(engine, system=None, max_tokens=8, read=lambda _: next(lines), out=out)
    assert repl.run() == 0
    tokens = call("GET", url + "/v1/sessions/bird")[1]["tokens"]
    assert f"Loaded {tokens} tokens" in out.getvalue()
    assert repl.messages == history
