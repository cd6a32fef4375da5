"""The JSON Schemas of the request bodies: the routes check bodies against
them (:mod:`.schema_check`) and ``/openapi.json`` publishes them, so the
two never disagree. Bounds that depend on the model (context size,
vocabulary) are filled in when the app is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oxillama.decoding.logprobs import MAX_TOP_LOGPROBS
from oxillama.serving.http.limits import Limits

__all__ = ["UNSUPPORTED", "RequestSchemas"]

Schema = dict[str, Any]

#: OpenAI fields accepted only at their neutral value, and why.
UNSUPPORTED = {
    "best_of": "only best_of=1 is supported",
    "echo": "echo is not supported",
    "suffix": "suffix (insertion) is not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "store": "stored completions are not supported",
}

SESSION_ID = r"^[A-Za-z0-9_-]{1,64}$"
#: Inputs one embeddings request may hold (OpenAI's limit).
MAX_EMBED_INPUTS = 2048

#: The most choices (``n``) one request may ask for: each is a sequence in
#: the batch.
MAX_CHOICES = 16

#: The most tools one request may offer.
MAX_TOOLS = 128


def _neutral(kind: str, value: Any, field: str) -> Schema:
    return {
        "type": [kind, "null"],
        "enum": [value, None],
        "description": f"Accepted only as {value!r} or null: {UNSUPPORTED[field]}.",
    }


#: The largest ``max_tokens`` a server with a context shift takes: a bound
#: on one request's work, far beyond any context (llama.cpp's server has
#: none).
MAX_SHIFTED_TOKENS = 1 << 20


@dataclass(frozen=True)
class RequestSchemas:
    """The request schemas for one model (context size ``n_ctx``,
    ``vocab`` token ids) under ``limits``; ``prompt_chars`` is the resolved
    character bound on prompts. Under a context shift (``serve
    --context-shift``) a prompt may fill the context and a generation may
    run past it, as with ``Engine(context_shift=True)``."""

    n_ctx: int
    vocab: int
    limits: Limits
    prompt_chars: int
    context_shift: bool = False

    @property
    def max_tokens(self) -> int:
        """The most tokens one request may ask for: the context size, or
        under a shift as many as ``MAX_SHIFTED_TOKENS`` (the context
        shifts as often as it fills)."""
        return MAX_SHIFTED_TOKENS if self.context_shift else self.n_ctx

    @property
    def max_prompt_ids(self) -> int:
        """Token ids a prompt may have: one must be left to generate,
        unless the context shifts."""
        return self.n_ctx if self.context_shift else self.n_ctx - 1

    def stop(self) -> Schema:
        n, chars = self.limits.max_stop, self.limits.max_stop_chars
        one = {"type": "string", "minLength": 1, "maxLength": chars}
        return {
            "anyOf": [one, {"type": "array", "maxItems": n, "items": one}, {"type": "null"}],
            "description": f"a string of 1 to {chars} characters, an array of at most {n} "
            "such strings, or null",
        }

    def logit_bias(self) -> Schema:
        return {
            "type": ["object", "null"],
            "maxProperties": self.limits.max_logit_bias,
            "propertyNames": {"type": "string", "pattern": r"^(0|[1-9][0-9]{0,9})$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
            "description": f"Token id (a decimal string, below {self.vocab}) to a bias in "
            f"[-100, 100] added to its logit; at most {self.limits.max_logit_bias} entries.",
        }

    def response_format(self) -> Schema:
        def kind(name: str) -> Schema:
            return {
                "type": "object",
                "properties": {"type": {"type": "string", "const": name}},
                "required": ["type"],
                "additionalProperties": False,
            }

        spec = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 256},
                "description": {"type": "string"},
                "schema": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
            "required": ["schema"],
            "additionalProperties": False,
        }
        json_schema = {
            "type": "object",
            "properties": {"type": {"type": "string", "const": "json_schema"}, "json_schema": spec},
            "required": ["type", "json_schema"],
            "additionalProperties": False,
        }
        return {
            "anyOf": [kind("text"), kind("json_object"), json_schema, {"type": "null"}],
            "description": "{'type': 'text'}, {'type': 'json_object'}, or {'type': "
            "'json_schema', 'json_schema': {'schema': {...}}}",
        }

    def common(self) -> dict[str, Schema]:
        """Fields both generation routes take."""
        max_tokens = {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": self.max_tokens,
            "description": (
                f"Tokens to generate, at most {self.max_tokens} (the context of {self.n_ctx} "
                "shifts when it fills)"
                if self.context_shift
                else f"Tokens to generate, at most the context size ({self.n_ctx})"
            )
            + f"; default {min(256, self.n_ctx)}.",
        }
        return {
            "model": {
                "type": ["string", "null"],
                "maxLength": 256,
                "description": "The served model's name, or a LoRA adapter's (see /v1/models).",
            },
            "lora": {
                "type": ["string", "null"],
                "maxLength": 256,
                "description": "A LoRA adapter the server was started with (--lora NAME=PATH).",
            },
            "speculative": {
                "type": ["string", "null"],
                "enum": ["ngram", "none", None],
                "description": "Speculative decoding for this request: 'ngram' (drafts from the "
                "context, verified in the batched pass; same tokens, often faster on text that "
                "copies its input) or 'none'; default: the server's --speculative.",
            },
            "max_tokens": max_tokens,
            "max_completion_tokens": max_tokens,
            "temperature": {"type": ["number", "null"], "minimum": 0},
            "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
            "top_k": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**31 - 1},
            "min_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "repetition_penalty": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "mirostat": {"type": ["integer", "null"], "enum": [0, 2, None]},
            "seed": {"type": ["integer", "null"], "minimum": -(2**63), "maximum": 2**64 - 1},
            "logit_bias": self.logit_bias(),
            "stop": self.stop(),
            "stream": {"type": ["boolean", "null"]},
            "stream_options": {
                "type": ["object", "null"],
                "properties": {"include_usage": {"type": ["boolean", "null"]}},
                "additionalProperties": False,
            },
            "n": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_CHOICES,
                "description": "Choices of the one prompt, which is evaluated once "
                "(not with a session).",
            },
            "user": {"type": ["string", "null"], "maxLength": 256},
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 512},
            },
            "store": _neutral("boolean", False, "store"),
            "frequency_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
            "presence_penalty": {"type": ["number", "null"], "minimum": -2, "maximum": 2},
            "ignore_eos": {"type": ["boolean", "null"]},
            "grammar": {"type": ["string", "null"], "description": "A GBNF grammar."},
            "response_format": self.response_format(),
            "session": {
                "type": ["string", "null"],
                "pattern": SESSION_ID,
                "description": "Continue this stateful session (1-64 of A-Z a-z 0-9 _ -).",
            },
        }

    def completion(self) -> Schema:
        text = {"type": "string", "maxLength": self.prompt_chars}
        prompt = {
            "anyOf": [
                text,
                {"type": "array", "minItems": 1, "maxItems": 1, "items": text},
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": self.max_prompt_ids,
                    "items": {"type": "integer", "minimum": 0, "maximum": self.vocab - 1},
                },
            ],
            "description": f"a string of at most {self.prompt_chars} characters, an array "
            f"of one such string, or an array of 1 to {self.max_prompt_ids} token ids below "
            f"{self.vocab}",
        }
        return {
            "type": "object",
            "properties": {
                "prompt": prompt,
                **self.common(),
                "best_of": _neutral("integer", 1, "best_of"),
                "echo": _neutral("boolean", False, "echo"),
                "suffix": {
                    "type": ["string", "null"],
                    "maxLength": 0,
                    "description": f"Only empty or null: {UNSUPPORTED['suffix']}.",
                },
                "logprobs": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_TOP_LOGPROBS,
                    "description": "Each token's log-probability and this many likely "
                    "alternatives (the model's own distribution, before sampling).",
                },
            },
            "required": ["prompt"],
            "additionalProperties": False,
        }

    def chat(self) -> Schema:
        return {
            "type": "object",
            "properties": {
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": self.n_ctx,
                    "items": {"$ref": "#/components/schemas/ChatMessage"},
                },
                "chat_template_kwargs": {
                    "type": ["object", "null"],
                    "description": "Variables for the chat template (enable_thinking, ...)",
                },
                **self.common(),
                "logprobs": {"type": ["boolean", "null"]},
                "top_logprobs": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_TOP_LOGPROBS,
                },
                "tools": {
                    "type": ["array", "null"],
                    "maxItems": MAX_TOOLS,
                    "items": {"$ref": "#/components/schemas/Tool"},
                },
                "functions": {
                    "type": ["array", "null"],
                    "maxItems": 0,
                    "description": f"Only empty or null: {UNSUPPORTED['functions']}.",
                },
                "tool_choice": {
                    "anyOf": [
                        {"type": "string", "enum": ["none", "auto", "required"]},
                        {
                            "type": "object",
                            "properties": {
                                "type": {"const": "function"},
                                "function": {
                                    "type": "object",
                                    "properties": {"name": {"type": "string"}},
                                    "required": ["name"],
                                    "additionalProperties": False,
                                },
                            },
                            "required": ["type", "function"],
                            "additionalProperties": False,
                        },
                        {"type": "null"},
                    ],
                    "description": "'none', 'auto', 'required' or "
                    "{'type': 'function', 'function': {'name': ...}}",
                },
                "function_call": _neutral("string", "none", "function_call"),
                "parallel_tool_calls": {"type": ["boolean", "null"]},
            },
            "required": ["messages"],
            "additionalProperties": False,
        }

    def tokenize(self) -> Schema:
        flag = {"type": ["boolean", "null"]}
        return {
            "type": "object",
            "properties": {
                "content": {"type": "string", "maxLength": self.prompt_chars},
                "add_special": {
                    **flag,
                    "description": "Add the model's BOS (and EOS) as it would (default false)",
                },
                "parse_special": {
                    **flag,
                    "description": "Read special-token text as those tokens (default true)",
                },
                "with_pieces": {
                    **flag,
                    "description": "Give each token as {id, piece} (default false)",
                },
            },
            "required": ["content"],
            "additionalProperties": False,
        }

    def rerank(self) -> Schema:
        text = {"type": "string", "maxLength": self.prompt_chars}
        many = MAX_EMBED_INPUTS
        return {
            "type": "object",
            "properties": {
                "query": {**text, "description": "What the documents are ranked against"},
                "documents": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": many,
                    "items": text,
                    "description": f"1 to {many} texts, each scored with the query",
                },
                "top_n": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "description": "Return only the best N (default: every document)",
                },
                "model": {"type": ["string", "null"], "maxLength": 256},
            },
            "required": ["query", "documents"],
            "additionalProperties": False,
        }

    def detokenize(self) -> Schema:
        return {
            "type": "object",
            "properties": {
                "tokens": {
                    "type": "array",
                    "maxItems": self.n_ctx,
                    "items": {"type": "integer", "minimum": 0, "maximum": self.vocab - 1},
                },
            },
            "required": ["tokens"],
            "additionalProperties": False,
        }

    def apply_template(self) -> Schema:
        chat = self.chat()["properties"]
        return {
            "type": "object",
            "properties": {
                "messages": chat["messages"],
                "tools": chat["tools"],
                "tool_choice": chat["tool_choice"],
                "add_generation_prompt": {
                    "type": ["boolean", "null"],
                    "description": "End with the assistant turn's opening (default true)",
                },
                "chat_template_kwargs": chat["chat_template_kwargs"],
            },
            "required": ["messages"],
            "additionalProperties": False,
        }

    def embeddings(self, dim: int) -> Schema:
        text = {"type": "string", "maxLength": self.prompt_chars}
        ids = {
            "type": "array",
            "minItems": 1,
            "maxItems": self.n_ctx,
            "items": {"type": "integer", "minimum": 0, "maximum": self.vocab - 1},
        }
        many = MAX_EMBED_INPUTS
        return {
            "type": "object",
            "properties": {
                "input": {
                    "anyOf": [
                        text,
                        {"type": "array", "minItems": 1, "maxItems": many, "items": text},
                        ids,
                        {"type": "array", "minItems": 1, "maxItems": many, "items": ids},
                    ],
                    "description": f"a string of at most {self.prompt_chars} characters, an "
                    f"array of 1 to {many} such strings, an array of 1 to {self.n_ctx} token "
                    f"ids below {self.vocab}, or an array of 1 to {many} such arrays",
                },
                "model": {"type": ["string", "null"], "maxLength": 256},
                "encoding_format": {
                    "type": ["string", "null"],
                    "enum": ["float", "base64", None],
                    "description": "'float' (default): arrays of numbers; 'base64': the "
                    "little-endian float32 bytes, base64-encoded",
                },
                "dimensions": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": dim,
                    "description": f"Keep the first 1 to {dim} values and renormalize "
                    "(Matryoshka-style truncation).",
                },
                "truncate": {
                    "type": ["boolean", "null"],
                    "description": "Cut a text longer than the context instead of answering "
                    "400 (default false, as OpenAI).",
                },
                "user": {"type": ["string", "null"], "maxLength": 256},
            },
            "required": ["input"],
            "additionalProperties": False,
        }

    def session_notes(self) -> dict[str, Schema]:
        """The bodies of the session routes the chat page uses: a session's
        notes (title, messages as shown, settings) and a fork."""
        message = {
            "type": "object",
            "properties": {
                "role": {"type": "string", "enum": ["system", "user", "assistant"]},
                "content": {"type": "string", "maxLength": self.prompt_chars},
                "reasoning_content": {"type": ["string", "null"], "maxLength": self.prompt_chars},
                "stopped": {
                    "type": ["boolean", "null"],
                    "description": "The reply was stopped before its end",
                },
            },
            "required": ["role", "content"],
            "additionalProperties": False,
        }
        settings = {
            "type": ["object", "null"],
            "properties": {
                "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
                "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": self.n_ctx},
                "seed": {"type": ["integer", "null"], "minimum": 0},
                "json_mode": {"type": ["boolean", "null"]},
                "json_schema": {"type": ["string", "null"], "maxLength": 65536},
            },
            "additionalProperties": False,
            "description": "The chat page's sampler settings for this session",
        }
        messages = {
            "type": "array",
            "maxItems": self.n_ctx,
            "items": {"$ref": "#/components/schemas/SessionMessage"},
        }
        title = {"type": "string", "minLength": 1, "maxLength": 200}
        return {
            "SessionMessage": message,
            "SessionSettings": settings,
            "SessionNotesRequest": {
                "type": "object",
                "properties": {
                    "title": title,
                    "messages": messages,
                    "settings": {"$ref": "#/components/schemas/SessionSettings"},
                },
                "required": ["title", "messages"],
                "additionalProperties": False,
            },
            "SessionForkRequest": {
                "type": "object",
                "properties": {
                    "id": {
                        "type": ["string", "null"],
                        "pattern": SESSION_ID,
                        "description": "The new session's id (default: a fresh one)",
                    },
                    "title": title,
                    "messages": {
                        **messages,
                        "description": "The history up to the message forked from",
                    },
                    "settings": {"$ref": "#/components/schemas/SessionSettings"},
                },
                "required": ["title", "messages"],
                "additionalProperties": False,
            },
        }

    def definitions(self, dim: int = 1) -> dict[str, Schema]:
        """Named schemas (``#/components/schemas/<name>``)."""
        part = {
            "type": "object",
            "properties": {"type": {"type": "string", "const": "text"}, "text": {"type": "string"}},
            "required": ["type", "text"],
            "additionalProperties": False,
        }
        content = {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"$ref": "#/components/schemas/TextPart"}},
                {"type": "null"},
            ],
            "description": "a string, an array of {'type': 'text', 'text': ...} parts, or null",
        }
        message = {
            "type": "object",
            "properties": {
                "role": {"type": "string", "minLength": 1, "maxLength": 64},
                "content": content,
                "name": {"type": ["string", "null"], "maxLength": 256},
            },
            # Chat templates read every message's content.
            "required": ["role", "content"],
            # Other keys (tool_calls, ...) go to the chat template as they are.
            "additionalProperties": True,
        }
        tool = {
            "type": "object",
            "properties": {
                "type": {"const": "function"},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": {
                            "type": "string",
                            "pattern": "^[A-Za-z0-9_.-]{1,64}$",
                        },
                        "description": {"type": ["string", "null"], "maxLength": 4096},
                        "parameters": {"type": ["object", "null"]},
                        "strict": {"type": ["boolean", "null"]},
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "function"],
            "additionalProperties": False,
        }
        return {
            "Tool": tool,
            "TextPart": part,
            "ChatMessage": message,
            "CompletionRequest": self.completion(),
            "ChatCompletionRequest": self.chat(),
            "EmbeddingRequest": self.embeddings(dim),
            "RerankRequest": self.rerank(),
            "TokenizeRequest": self.tokenize(),
            "DetokenizeRequest": self.detokenize(),
            "ApplyTemplateRequest": self.apply_template(),
            **self.session_notes(),
        }
