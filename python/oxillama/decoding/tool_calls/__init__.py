"""Tool calling: detecting calls in generated text (:class:`ToolCallDetector`),
picking the format from a chat template, and the grammar that forces a
valid call when a request requires one."""

from __future__ import annotations

from oxillama.decoding.tool_calls.detector import Custom, ToolCall, ToolCallDetector, ToolFormat

__all__ = ["Custom", "ToolCall", "ToolCallDetector", "ToolFormat"]
