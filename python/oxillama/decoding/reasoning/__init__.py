"""Reasoning kept apart from the answer: the text a thinking model writes
between ``<think>`` and ``</think>`` at the start of its reply (DeepSeek-R1
distills, Qwen3), split off as it streams; and a harmony reply (gpt-oss)
split into its analysis, final and tool-call messages."""

from __future__ import annotations

from oxillama.decoding.reasoning.cap import ReasoningCap
from oxillama.decoding.reasoning.harmony import (
    HarmonyDelta,
    HarmonyParser,
    parse_harmony,
    speaks_harmony,
)
from oxillama.decoding.reasoning.reply import ReplySplit
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
    "HarmonyDelta",
    "HarmonyParser",
    "ReasoningCap",
    "ReasoningFormat",
    "ReasoningSplitter",
    "ReplySplit",
    "check_reasoning",
    "opens_reasoning",
    "parse_harmony",
    "speaks_harmony",
    "split_reasoning",
    "thinks",
]
