"""/openapi.json: a valid OpenAPI 3.1 document whose paths and methods are
exactly the app's routes, whose request schemas are the ones the routes
enforce (the server's checker agrees with a reference JSON Schema
validator on generated bodies) and whose response schemas the real
responses match."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from starlette.routing import Route

from oxillama import AsyncEngine
from oxillama.serving.http import Limits, build_app
from oxillama.serving.http.auth import TEXT_TOOLS
from oxillama.serving.http.schema_check import SchemaViolation, check
from tests._serve import serving

MODEL = "smollm2"


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[AsyncEngine]:
    e = AsyncEngine(model_path, context_size=128, threads=2, max_batch=2)
    yield e
    asyncio.run(e.close())


@pytest.fixture(scope="module")
def served(model_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    engine = AsyncEngine(model_path, context_size=128, threads=2, max_batch=2)
    with serving(engine, MODEL, limits=Limits(max_stop=4, max_logit_bias=8)) as url:
        doc = json.loads(urllib.request.urlopen(url + "/openapi.json").read())
        yield url, doc


def routes_of(app: Any) -> dict[str, set[str]]:
    return {
        r.path: {m.lower() for m in (r.methods or ())} - {"head"}
        for r in app.routes
        if isinstance(r, Route)
    }


@pytest.mark.parametrize(("keys", "metrics_auth"), [((), False), (("sk-1",), True)])
def test_the_document_is_valid_and_lists_exactly_the_routes(
    engine: AsyncEngine, keys: tuple[str, ...], metrics_auth: bool
) -> None:
    app = build_app(engine, model_name=MODEL, api_keys=keys, metrics_auth=metrics_auth)
    doc = app.state.server.document
    validate(doc)
    assert {p: set(ops) for p, ops in doc["paths"].items()} == routes_of(app)
    for path, ops in doc["paths"].items():
        for op in ops.values():
            guarded = bool(keys) and (
                path.startswith("/v1/") or path == "/metrics" or path in TEXT_TOOLS
            )
            assert ("401" in op["responses"]) == guarded, path
            assert ("security" in op) == guarded
            assert {"200", "400", "413"} <= set(op["responses"])
    gen = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"404", "503"} <= set(gen)
    unavailable = doc["components"]["responses"]["Unavailable"]
    assert "Retry-After" in unavailable["headers"]


def test_the_served_document_matches_real_responses(served: tuple[str, dict[str, Any]]) -> None:
    url, doc = served
    validate(doc)

    def conforms(path: str, method: str, status: int, body: Any) -> None:
        response = doc["paths"][path][method]["responses"][str(status)]
        if "$ref" in response:
            response = doc["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
        schema = response["content"]["application/json"]["schema"]
        root = {**schema, "components": doc["components"]}
        jsonschema.validate(body, root, cls=jsonschema.Draft202012Validator)

    def call(path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    cases: list[tuple[str, str, dict[str, Any] | None, int]] = [
        ("/v1/models", "get", None, 200),
        ("/health", "get", None, 200),
        ("/v1/completions", "post", {"prompt": "Hi", "max_tokens": 3}, 200),
        ("/v1/completions", "post", {"prompt": "Hi", "n": 17}, 400),
        (
            "/v1/completions",
            "post",
            {"prompt": "Hi", "max_tokens": 2, "n": 2, "logprobs": 2},
            200,
        ),
        ("/v1/completions", "post", {"prompt": "Hi", "model": "other"}, 404),
        ("/v1/chat/completions", "post", {"messages": [{"role": "user", "content": "Hi"}]}, 200),
        ("/v1/sessions/x/save", "post", {}, 400),
        ("/v1/responses", "post", {"input": "Hi", "max_output_tokens": 3}, 200),
        ("/v1/responses", "post", {"input": "Hi", "tools": [{"type": "web_search"}]}, 400),
        ("/v1/responses", "post", {"input": "Hi", "previous_response_id": "resp_x"}, 404),
    ]
    for path, method, body, status in cases:
        got, out = call(path, body)
        assert got == status, (path, out)
        conforms(path.replace("/x/", "/{sid}/"), method, status, out)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.sampled_from([0, 1, 2, -1, 1.0, 2.5, 100.5, 2**64 - 1, 2**64])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_characters="\n"), max_size=5)
    | st.sampled_from(["", "x" * 257, "0", "49151", "007", "text", "json_object", "json_schema"]),
    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=4), c, max_size=4),
    max_leaves=8,
)


# Values on both sides of the schemas' bounds, so that generated bodies are
# often valid and often just barely not.
EDGES = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        1,
        -1,
        2,
        0.5,
        1.5,
        100,
        101,
        -100.0,
        -101,
        128,
        129,
        2**63,
        -(2**63) - 1,
        2**64,
        "",
        "x",
        "x" * 257,
        "none",
        "auto",
        "ok-id_1",
        "bad id",
        [],
        ["a"],
        ["a"] * 5,
        [1, 2],
        [128000],
        {},
        {"5": 1},
        {"5": 101},
        {"05": 1},
        {"x": 1},
        {"include_usage": True},
        {"type": "text"},
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": {}}},
        {"type": "json_schema", "json_schema": {"name": "n"}},
        {"k": "v"},
    ]
)
BASES = {
    "CompletionRequest": {"prompt": "Hi"},
    "ChatCompletionRequest": {"messages": [{"role": "user", "content": "Hi"}]},
}
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "", 3, "r" * 65])},
    optional={
        "content": EDGES | JSON | st.just([{"type": "text", "text": "t"}]),
        "name": EDGES,
        "tool_calls": JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_servers_checker_agrees_with_a_reference_validator(
    served: tuple[str, dict[str, Any]], data: st.DataObject
) -> None:
    _, doc = served
    schemas = doc["components"]["schemas"]
    name = data.draw(st.sampled_from(sorted(BASES)))
    fields = [*schemas[name]["properties"], "unknown"]
    body = dict(BASES[name])
    values = st.one_of(EDGES, EDGES, EDGES, JSON)
    body.update(data.draw(st.dictionaries(st.sampled_from(fields), values, max_size=2)))
    if data.draw(st.integers(0, 7)) == 0:
        body.pop(next(iter(BASES[name])), None)
    if name == "ChatCompletionRequest" and data.draw(st.integers(0, 3)) == 0:
        body["messages"] = data.draw(st.lists(MESSAGE, max_size=3))
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    reference = jsonschema.Draft202012Validator(root).is_valid(body)
    event(f"valid: {reference}")
    try:
        check(body, schemas[name], "", schemas)
        ours = True
    except SchemaViolation:
        ours = False
    assert ours == reference, body
