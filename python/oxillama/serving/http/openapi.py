"""The OpenAPI 3.1 document the server publishes at ``/openapi.json``.

Request bodies use the very schemas the routes check bodies against
(:mod:`.request_schemas`); every status a route can answer is listed, each
error with OpenAI's error object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oxillama._native import __version__
from oxillama.serving.http.anthropic.openapi import messages_paths, messages_schemas
from oxillama.serving.http.request_schemas import SESSION_ID
from oxillama.serving.http.responses.schema import RESPONSE_ID, response_schemas

__all__ = ["openapi_document"]

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}

_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
}

_FINISH = {"type": ["string", "null"], "enum": ["stop", "length", None]}


_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}
_NUM: Schema = {"type": "number"}
_OBJ: Schema = {"type": "object"}


def _const(value: str) -> Schema:
    return {"type": "string", "const": value}


def _array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _object(
    props: Mapping[str, Schema], *, optional: tuple[str, ...] = (), nullable: bool = False
) -> Schema:
    """An object whose properties are all required but ``optional``."""
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": dict(props),
        "required": [k for k in props if k not in optional],
    }


def _reply(obj: str, choice: Schema) -> Schema:
    return {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "const": obj},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": _USAGE,
            "seed": {
                "type": "integer",
                "description": "The sampler's seed (on the last chunk of a stream); "
                "a request without a seed gets a fresh one, and sending this one "
                "back repeats the text.",
            },
        },
        "required": ["id", "object", "created", "model", "choices"],
    }


_RESPONSES: dict[str, tuple[str, str]] = {
    "400": ("BadRequest", "The request is malformed or asks for more than this server allows."),
    "401": ("Unauthorized", "No API key, or not one this server accepts."),
    "404": ("NotFound", "No such model, or no such (or an evicted) session."),
    "409": ("Conflict", "A session with that id already exists."),
    "413": ("TooLarge", "The request body is over --max-body-bytes."),
    "501": ("NotSupported", "This server was not started to serve this route."),
    "503": ("Unavailable", "The server is full for now: retry after Retry-After seconds."),
}


def _error_response(description: str, *, retry: bool = False) -> Schema:
    out: Schema = {"description": description, "content": _json(_ref("Error"))}
    if retry:
        out["headers"] = {
            "Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer"}}
        }
    if description == _RESPONSES["401"][1]:
        out["headers"] = {
            "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}
        }
    return out


def _errors(*codes: str) -> dict[str, Schema]:
    return {c: {"$ref": f"#/components/responses/{_RESPONSES[c][0]}"} for c in codes}


def _operation(
    summary: str,
    ok: Schema,
    errors: tuple[str, ...],
    *,
    guarded: bool,
    body: str | None = None,
    params: list[Schema] | None = None,
) -> Schema:
    # Every route sits behind the body limit (413, and 400 for a bad
    # Content-Length); guarded ones behind the key check too.
    codes = sorted({"400", "413", *errors, *(("401",) if guarded else ())})
    op: Schema = {"summary": summary, "responses": {"200": ok, **_errors(*codes)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json(_ref(body))}
    if params:
        op["parameters"] = params
    if guarded:
        op["security"] = [{"bearer": []}]
    return op


def _session_summary() -> Schema:
    return _object(
        {
            "id": _STR,
            "title": {"type": ["string", "null"]},
            "tokens": {
                "type": ["integer", "null"],
                "description": "Tokens in its context while live (null when not in memory)",
            },
            "live": {"type": "boolean"},
            "saved": {"type": "boolean", "description": "Its snapshot is in --sessions-dir"},
            "n_messages": _INT,
            "updated": {"type": ["number", "null"], "description": "When its notes were written"},
        }
    )


def openapi_document(
    request_schemas: Mapping[str, Schema],
    *,
    model_name: str,
    auth: bool,
    metrics_auth: bool,
    webui: bool = False,
) -> Schema:
    """The document for an app with these request schemas; ``auth`` and
    ``metrics_auth`` say which routes need a key, ``webui`` whether the
    chat page is served."""
    logprobs_legacy = _object(
        {
            "tokens": _array(_STR),
            "token_logprobs": _array(_NUM),
            "top_logprobs": _array(_OBJ),
            "text_offset": _array(_INT),
        },
        nullable=True,
    )
    text_choice = _object(
        {"index": _INT, "text": _STR, "logprobs": logprobs_legacy, "finish_reason": _FINISH},
        optional=("logprobs",),
    )
    message = _object({"role": {"type": "string", "const": "assistant"}, "content": _STR})
    chat_choice = _object(
        {
            "index": _INT,
            "message": message,
            "logprobs": _object({"content": _array(_OBJ)}, nullable=True),
            "finish_reason": _FINISH,
        },
        optional=("logprobs",),
    )
    sse = {
        "text/event-stream": {
            "schema": {
                "type": "string",
                "description": "Server-sent events: 'data: <chunk JSON>' lines, then "
                "'data: [DONE]' (or an error object if the generation fails midway).",
            }
        }
    }
    model = _object({"id": _STR, "object": _const("model"), "created": _INT, "owned_by": _STR})
    embedding = _object(
        {
            "object": _const("embedding"),
            "index": _INT,
            "embedding": {"anyOf": [_array(_NUM), {"type": "string", "contentEncoding": "base64"}]},
        }
    )
    schemas: dict[str, Schema] = {
        **request_schemas,
        **messages_schemas(),
        **response_schemas(),
        "Error": _ERROR,
        "Completion": _reply("text_completion", text_choice),
        "ChatCompletion": _reply("chat.completion", chat_choice),
        "ModelList": _object({"object": _const("list"), "data": _array(model)}),
        "EmbeddingList": _object(
            {
                "object": _const("list"),
                "data": _array(embedding),
                "model": _STR,
                "usage": _object({"prompt_tokens": _INT, "total_tokens": _INT}),
            }
        ),
        "RerankList": _object(
            {
                "model": _STR,
                "object": _const("list"),
                "usage": _object({"prompt_tokens": _INT, "total_tokens": _INT}),
                "results": _array(_object({"index": _INT, "relevance_score": _NUM})),
            }
        ),
        "SessionSaved": _object({"id": _STR, "tokens": _INT, "path": _STR}),
        "Tokens": _object(
            {
                "tokens": _array(
                    {
                        "anyOf": [
                            _INT,
                            _object(
                                {
                                    "id": _INT,
                                    "piece": {"anyOf": [_STR, _array(_INT)]},
                                }
                            ),
                        ]
                    }
                )
            }
        ),
        "Detokenized": _object({"content": _STR}),
        "RenderedPrompt": _object({"prompt": _STR}),
        "SessionRestored": _object({"id": _STR, "tokens": _INT}),
        "SessionSummary": _session_summary(),
        "SessionList": _object({"object": _const("list"), "data": _array(_ref("SessionSummary"))}),
        "Session": {
            **_session_summary(),
            "properties": {
                **_session_summary()["properties"],
                "messages": _array(_ref("SessionMessage")),
                "settings": {"anyOf": [_ref("SessionSettings"), {"type": "null"}]},
            },
            "required": [*_session_summary()["required"], "messages", "settings"],
        },
        "SessionDeleted": _object({"id": _STR, "deleted": {"type": "boolean", "const": True}}),
        "SessionForked": _object(
            {
                "id": _STR,
                "copied": {
                    "type": "boolean",
                    "description": "The source's state was copied (false: the source had "
                    "none here, and the fork's first turn evaluates the whole history)",
                },
                "tokens": _INT,
            }
        ),
        "ServerInfo": _object(
            {
                "model": _STR,
                "arch": _STR,
                "n_ctx": _INT,
                "kv_type": _STR,
                "reasoning": {"type": "boolean"},
                "sessions_dir": {"type": "boolean"},
            }
        ),
    }
    v1 = auth

    def ok(description: str, content: Schema) -> Schema:
        return {"description": description, "content": content}

    def api(
        summary: str,
        ok_text: str,
        reply: str,
        errors: tuple[str, ...] = (),
        *,
        body: str | None = None,
        params: list[Schema] | None = None,
    ) -> Schema:
        # Most routes: behind the key check, one JSON schema in reply.
        return _operation(
            summary, ok(ok_text, _json(_ref(reply))), errors, guarded=v1, body=body, params=params
        )

    def generation(summary: str, body: str, reply: str) -> Schema:
        return _operation(
            summary,
            ok(f"The {reply}, or its stream with 'stream': true", {**_json(_ref(reply)), **sse}),
            ("404", "503"),
            guarded=v1,
            body=body,
        )

    rerank = api(
        "Score documents against a query with a reranker (llama-server's shape; the server "
        "needs --reranking), best first",
        "Each document's index and relevance score",
        "RerankList",
        ("501", "503"),
        body="RerankRequest",
    )
    sid = [
        {
            "name": "sid",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": SESSION_ID},
        }
    ]
    rid = [
        {
            "name": "rid",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": RESPONSE_ID},
        }
    ]
    paths: Schema = {
        "/health": {
            "get": _operation("Liveness", ok("Alive", _json({"type": "object"})), (), guarded=False)
        },
        "/ready": {
            "get": _operation(
                "Readiness: the model is loaded and the server is not draining",
                ok("Ready", _json({"type": "object"})),
                ("503",),
                guarded=False,
            )
        },
        "/metrics": {
            "get": _operation(
                "Prometheus metrics",
                ok("Prometheus text exposition", {"text/plain": {"schema": {"type": "string"}}}),
                (),
                guarded=auth and metrics_auth,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "This document", ok("OpenAPI 3.1", _json({"type": "object"})), (), guarded=False
            )
        },
        "/v1/models": {"get": api("The model this server runs", "One model", "ModelList")},
        "/v1/completions": {
            "post": generation("Continue a prompt", "CompletionRequest", "Completion")
        },
        "/v1/chat/completions": {
            "post": generation("Reply to a conversation", "ChatCompletionRequest", "ChatCompletion")
        },
        **messages_paths(guarded=v1),
        "/v1/responses": {
            "post": _operation(
                "Reply to input items, optionally continuing a stored response "
                "(OpenAI's Responses API)",
                ok(
                    "The response, or its stream of events with 'stream': true",
                    {
                        **_json(_ref("Response")),
                        "text/event-stream": {
                            "schema": {
                                "type": "string",
                                "description": "Server-sent events 'event: <type>' / 'data: "
                                "<event JSON>' with sequence_number: response.created, "
                                "response.in_progress, then per output item "
                                "response.output_item.added, its parts and deltas "
                                "(output_text, reasoning_text, function_call_arguments) "
                                "and response.output_item.done, then response.completed "
                                "(response.incomplete when cut by max_output_tokens), or an "
                                "'error' event if the generation fails midway.",
                            }
                        },
                    },
                ),
                ("404", "503"),
                guarded=v1,
                body="ResponseRequest",
            )
        },
        "/v1/responses/{rid}": {
            "get": api("A stored response", "The response", "Response", ("404",), params=rid),
            "delete": api(
                "Delete a stored response and its session",
                "Deleted",
                "ResponseDeleted",
                ("404",),
                params=rid,
            ),
        },
        "/v1/embeddings": {
            "post": api(
                "Embed texts or token ids",
                "One vector per input",
                "EmbeddingList",
                ("404", "503"),
                body="EmbeddingRequest",
            )
        },
        "/v1/rerank": {"post": rerank},
        "/rerank": {"post": rerank},
        "/tokenize": {
            "post": api(
                "Text to token ids (llama-server's shape)",
                "The ids, or {id, piece} with with_pieces",
                "Tokens",
                (),
                body="TokenizeRequest",
            )
        },
        "/detokenize": {
            "post": api(
                "Token ids to text (llama-server's shape)",
                "The text",
                "Detokenized",
                (),
                body="DetokenizeRequest",
            )
        },
        "/apply-template": {
            "post": api(
                "The prompt the chat endpoint would run for these messages",
                "The rendered prompt",
                "RenderedPrompt",
                (),
                body="ApplyTemplateRequest",
            )
        },
        "/v1/sessions/{sid}/save": {
            "post": api(
                "Write a session to <sessions-dir>/<sid>.oxisnap",
                "Saved",
                "SessionSaved",
                ("404", "503"),
                params=sid,
            )
        },
        "/v1/sessions": {
            "get": api(
                "Every session this server knows (live, saved, or with notes), newest first",
                "The sessions",
                "SessionList",
            )
        },
        "/v1/sessions/{sid}": {
            "get": api(
                "A session's notes (title, messages, settings) and state",
                "The session",
                "Session",
                ("404",),
                params=sid,
            ),
            "put": api(
                "Write a session's notes (with --sessions-dir, to <sid>.oxisnap.chat.json)",
                "The session",
                "Session",
                (),
                body="SessionNotesRequest",
                params=sid,
            ),
            "delete": api(
                "Close a session and remove its snapshot and notes",
                "Deleted",
                "SessionDeleted",
                ("404",),
                params=sid,
            ),
        },
        "/v1/sessions/{sid}/fork": {
            "post": api(
                "A new session holding a copy of this one's state, with the history up to "
                "the message forked from as its notes",
                "Forked",
                "SessionForked",
                ("404", "409", "503"),
                body="SessionForkRequest",
                params=sid,
            )
        },
        "/v1/sessions/{sid}/snapshot": {
            "get": _operation(
                "The session as an OXISNAP1 file",
                ok(
                    "The snapshot",
                    {"application/octet-stream": {"schema": {"type": "string"}}},
                ),
                ("404", "503"),
                guarded=v1,
                params=sid,
            ),
            "put": api(
                "Make an OXISNAP1 file (the body) this session, replacing a live one",
                "Imported",
                "SessionRestored",
                ("503",),
                params=sid,
            )
            | {
                "requestBody": {
                    "required": True,
                    "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                }
            },
        },
        "/v1/info": {
            "get": api(
                "The model's name, architecture, context size and KV cache type",
                "Info",
                "ServerInfo",
            )
        },
        "/v1/sessions/{sid}/restore": {
            "post": api(
                "Load <sessions-dir>/<sid>.oxisnap as the live session",
                "Restored",
                "SessionRestored",
                ("404", "503"),
                params=sid,
            )
        },
    }
    if webui:
        html = {"text/html": {"schema": {"type": "string"}}}
        page = {"text/css": {"schema": {"type": "string"}}, **html}
        paths["/"] = {"get": _operation("The chat page", ok("HTML", html), (), guarded=False)}
        paths["/webui/{name}"] = {
            "get": _operation(
                "A file of the chat page (its scripts and styles)",
                ok("The file", {**page, "text/javascript": {"schema": {"type": "string"}}}),
                ("404",),
                guarded=False,
                params=[{"name": "name", "in": "path", "required": True, "schema": _STR}],
            )
        }
    components: Schema = {
        "schemas": schemas,
        "responses": {
            name: _error_response(text, retry=code == "503")
            for code, (name, text) in _RESPONSES.items()
        },
    }
    if auth:
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            # Anthropic's clients send the key in this header.
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "oxillama",
            "version": __version__,
            "description": f"An OpenAI-compatible API serving the model '{model_name}'.",
        },
        "paths": paths,
        "components": components,
    }
