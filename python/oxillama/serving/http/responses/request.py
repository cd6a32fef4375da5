"""A checked ``POST /v1/responses`` body as the chat machinery takes it:
``input`` items as chat messages, tools and ``tool_choice`` in the chat
endpoint's shape, ``text.format`` as a JSON schema.

Every kind of item, content part, tool or format the server does not
serve is refused with a 400 naming it (``input_image``, ``web_search``,
``item_reference``, ...), never dropped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oxillama.serving.http.api_error import ApiError

__all__ = ["ResponseAsk", "chat_messages", "read_request"]

Message = dict[str, Any]

#: A message item's role as the chat templates know it (they have no
#: ``developer``: it is the system prompt by another name).
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
#: Parts whose text a message carries.
_TEXT_PARTS = ("input_text", "output_text", "text")
#: Keys an output item sent back as input may carry beside its content
#: (they describe the item; the turn renders the same without them).
_ECHOED = {"id", "status", "type", "phase"}


@dataclass(frozen=True)
class ResponseAsk:
    """What one request asks for."""

    #: The new input as chat messages (no ``instructions``).
    messages: list[Message]
    instructions: str | None
    #: ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` as a chat
    #: request carries them (for :func:`~..tools.tool_request`).
    chat_tools: dict[str, Any]
    #: The request's tools and choice as the response object echoes them.
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool
    #: ``text.format`` as given (echoed), and the schema it constrains to.
    text_format: dict[str, Any]
    json_schema: Any
    max_output_tokens: int | None
    temperature: float
    top_p: float
    store: bool
    previous_response_id: str | None
    stream: bool
    metadata: dict[str, str]
    user: str | None


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="unsupported_value")


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{where}' must be a string or a list of text parts", "input")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, Mapping):
            raise _bad(f"'{at}' must be an object", "input")
        kind = part.get("type")
        if kind not in _TEXT_PARTS:
            raise _bad(
                f"'{at}.type' is {kind!r}: this server reads text parts only "
                "(input_text, output_text); images, files and audio are not supported",
                "input",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad(f"'{at}.text' must be a string", "input")
        texts.append(text)
    return "".join(texts)


def _field(item: Mapping[str, Any], key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str):
        raise _bad(f"'{where}.{key}' must be a string", "input")
    return v


def chat_messages(items: Any) -> list[Message]:
    """``input`` as chat messages: a string is one user turn; function calls
    join the assistant turn they follow (the reply's text, then its calls),
    and each call's output is a ``tool`` turn."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[Message] = []
    names: dict[str, str] = {}
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(
                    f"'{where}.role' is {role!r}: one of user, system, developer, assistant",
                    "input",
                )
            extra = {k for k, v in item.items() if v is not None} - _ECHOED - {"role", "content"}
            if extra:
                raise _bad(
                    f"'{where}' has fields this server does not read: {sorted(extra)}", "input"
                )
            msg: Message = {
                "role": _ROLES[role],
                "content": _content_text(item.get("content"), f"{where}.content"),
            }
            if role == "assistant" and reasoning:
                msg["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(msg)
        elif kind == "function_call":
            call_id = _field(item, "call_id", where)
            name = _field(item, "name", where)
            arguments = _field(item, "arguments", where)
            names[call_id] = name
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                out.append(msg)
        elif kind == "function_call_output":
            call_id = _field(item, "call_id", where)
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{where}.output")
            tool: Message = {"role": "tool", "tool_call_id": call_id, "content": text}
            if call_id in names:
                tool["name"] = names[call_id]
            out.append(tool)
        elif kind == "reasoning":
            # A reasoning item sent back goes with the assistant turn it
            # preceded, where templates that keep reasoning read it.
            for part in item.get("content") or []:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    reasoning.append(part["text"])
        else:
            raise _bad(
                f"'{where}.type' is {kind!r}: this server reads message, function_call, "
                "function_call_output and reasoning items",
                "input",
            )
    return out


def _tools(raw: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tools as echoed and in the chat endpoint's shape."""
    echoed, chat = [], []
    for i, t in enumerate(raw):
        kind = t.get("type")
        if kind != "function":
            raise _bad(
                f"'tools[{i}].type' is {kind!r}: built-in tools are not supported; "
                "this server calls function tools only",
                "tools",
            )
        extra = set(t) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise _bad(
                f"'tools[{i}]' has fields this server does not read: {sorted(extra)}", "tools"
            )
        name = t.get("name")
        if not isinstance(name, str):
            raise _bad(f"'tools[{i}].name' must be a string", "tools")
        fn: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if t.get(key) is not None:
                fn[key] = t[key]
        chat.append({"type": "function", "function": fn})
        echoed.append(
            {
                "type": "function",
                "name": name,
                "description": t.get("description"),
                "parameters": t.get("parameters"),
                "strict": t.get("strict"),
            }
        )
    return echoed, chat


def _tool_choice(choice: Any) -> Any:
    """``tool_choice`` in the chat endpoint's shape."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise _bad(
            f"'tool_choice' is {choice!r}: this server takes 'none', 'auto', 'required' or "
            "{'type': 'function', 'name': ...}",
            "tool_choice",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def _text_format(text: Mapping[str, Any] | None) -> tuple[dict[str, Any], Any]:
    """``text.format`` as echoed, and the JSON schema the output must match."""
    text = text or {}
    extra = set(text) - {"format", "verbosity"}
    if extra:
        raise _bad(f"'text' has fields this server does not read: {sorted(extra)}", "text")
    if text.get("verbosity") is not None:
        raise _bad("'text.verbosity' is not supported", "text")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return {"type": "text"}, None
    if kind == "json_object":
        return {"type": "json_object"}, {"type": "object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise _bad("'text.format.schema' must be a JSON schema object", "text")
        extra = set(fmt) - {"type", "name", "schema", "strict", "description"}
        if extra:
            raise _bad(
                f"'text.format' has fields this server does not read: {sorted(extra)}", "text"
            )
        return dict(fmt), schema
    raise _bad(f"'text.format.type' is {kind!r}: one of text, json_object, json_schema", "text")


def read_request(body: Mapping[str, Any]) -> ResponseAsk:
    """``body`` (already checked against the schema) as a :class:`ResponseAsk`."""
    raw_tools = body.get("tools") or []
    echoed, chat_tools = _tools(raw_tools)
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    fmt, schema = _text_format(body.get("text"))
    return ResponseAsk(
        messages=chat_messages(body["input"]),
        instructions=body.get("instructions"),
        chat_tools={
            "tools": chat_tools,
            "tool_choice": _tool_choice(choice),
            "parallel_tool_calls": parallel,
        },
        tools=echoed,
        tool_choice=choice if choice is not None else "auto",
        parallel_tool_calls=parallel is not False,
        text_format=fmt,
        json_schema=schema,
        max_output_tokens=body.get("max_output_tokens"),
        temperature=float(body["temperature"]) if body.get("temperature") is not None else 1.0,
        top_p=float(body["top_p"]) if body.get("top_p") is not None else 1.0,
        store=body.get("store") is not False,
        previous_response_id=body.get("previous_response_id"),
        stream=bool(body.get("stream")),
        metadata=dict(body.get("metadata") or {}),
        user=body.get("user"),
    )
