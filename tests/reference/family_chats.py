"""Conversations and real chat templates per model family (shared by
make_chat_reference.py and tests/test_chat_template_families.py)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).parent / "chat_templates"

#: Template file stem -> (bos_token, eos_token) of its model.
TEMPLATE_FILES: dict[str, tuple[str, str]] = {
    "qwen2.5-7b-instruct": ("", "<|im_end|>"),
    "qwen3-0.6b": ("", "<|im_end|>"),
    "gemma-7b-it": ("<bos>", "<eos>"),
    "gemma-2-2b-it": ("<bos>", "<eos>"),
    "gemma-4-31b-it": ("<bos>", "<eos>"),
    "phi-3-mini": ("<s>", "<|endoftext|>"),
    "phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "command-r-plus-tool-use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "granite-3.0-8b-instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "granite-3.3-2b-instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "granite-4.0": ("<|end_of_text|>", "<|end_of_text|>"),
    "mistral-7b-instruct-v0.2": ("<s>", "</s>"),
    "mistral-nemo-instruct-2407": ("<s>", "</s>"),
    "mistral-small-3.2-24b-instruct-2506": ("<s>", "</s>"),
    "openai-gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
}

#: Vocabulary-only GGUFs (scripts/fetch_vocabs.py) that carry a template.
GGUF_TEMPLATES = ("command-r", "phi-3", "qwen2")

#: The date ``strftime_now`` gives while rendering, so that templates that
#: print today's date (Granite, Mistral Small) render the same every day.
FIXED_NOW = datetime(2026, 1, 15, 9, 30)


def fixed_strftime_now(fmt: str) -> str:
    return FIXED_NOW.strftime(fmt)


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
                "required": ["city"],
            },
        },
    }
]

_SYSTEM = {"role": "system", "content": "You are a terse assistant."}
_HI = {"role": "user", "content": "Hello!"}
_BLUE = {"role": "assistant", "content": "Blue."}
_ASK = {"role": "user", "content": "Name a color."}
_AGAIN = {"role": "user", "content": "Another one, in Japanese: 日本語で"}
_WEATHER = {"role": "user", "content": "What is the weather in Paris?"}
# Mistral's templates want 9-character alphanumeric tool-call ids.
_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call12345",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ],
}
_RESULT = {
    "role": "tool",
    "tool_call_id": "call12345",
    "name": "get_weather",
    "content": '{"temperature_c": 21, "sky": "clear"}',
}

#: name -> (messages, add_generation_prompt, extra template variables)
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], bool, dict[str, Any]]] = {
    "user": ([_HI], True, {}),
    "system_user": ([_SYSTEM, _HI], True, {}),
    "multi_turn": ([_SYSTEM, _ASK, _BLUE, _AGAIN], True, {}),
    "multi_turn_no_system": ([_ASK, _BLUE, _AGAIN], True, {}),
    "ends_with_assistant": ([_ASK, _BLUE], False, {}),
    "system_user_no_prompt": ([_SYSTEM, _HI], False, {}),
    "whitespace_and_markup": (
        [{"role": "user", "content": "  spaces \n\t<b>bold</b> <|im_start|> é  "}],
        True,
        {},
    ),
    "tools": ([_WEATHER], True, {"tools": TOOLS}),
    "tool_call_and_result": ([_WEATHER, _CALL, _RESULT], True, {"tools": TOOLS}),
    "thinking_off": ([_HI], True, {"enable_thinking": False}),
}


def template_source(stem: str) -> str:
    return (TEMPLATE_DIR / f"{stem}.jinja").read_text(encoding="utf-8")
