"""Reasoning kept apart from the answer: the text a thinking model writes
between ``<think>`` and ``</think>`` at the start of its reply (DeepSeek-R1
distills, Qwen3), split off as it streams."""

from __future__ import annotations

from oxillama.decoding.reasoning.splitter import (
    REASONING_FORMATS,
    ReasoningFormat,
    ReasoningSplitter,
    check_reasoning,
    opens_reasoning,
    split_reasoning,
    thinks,
)

__all__ = [
    "REASONING_FORMATS",
    "ReasoningFormat",
    "ReasoningSplitter",
    "check_reasoning",
    "opens_reasoning",
    "split_reasoning",
    "thinks",
]
