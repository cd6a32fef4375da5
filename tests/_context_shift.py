"""Engines and servers with llama.cpp's context shift at a small context,
shared by the context-shift tests (``test_context_shift_requests.py``,
``test_serve_context_shift.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from oxillama import AsyncEngine, Engine, SamplerConfig
from oxillama.serving.flags import serve_options_from_mapping
from tests._serve import serving_app

#: A context small enough that a short test runs past it several times.
N_CTX, KEEP = 64, 4


def _greedy(n_ctx: int, n_keep: int, shift: bool) -> dict[str, Any]:
    """The settings every context-shift engine of these tests shares."""
    return {
        "context_size": n_ctx,
        "threads": 2,
        "sampler": SamplerConfig.greedy(),
        "context_shift": shift,
        "n_keep": n_keep,
    }


def shifted(model_path: Path, n_ctx: int = N_CTX, n_keep: int = KEEP, **kw: Any) -> Engine:
    """A greedy engine that shifts its context, keeping ``n_keep`` tokens."""
    return Engine(model_path, **_greedy(n_ctx, n_keep, True), **kw)


def shifted_async(model_path: Path, shift: bool = True, **kw: Any) -> AsyncEngine:
    """The same as an ``AsyncEngine`` at ``N_CTX``/``KEEP`` (``shift=False``:
    without the shift)."""
    return AsyncEngine(model_path, **_greedy(N_CTX, KEEP, shift), **kw)


def served(model_path: Path, shift: bool) -> Iterator[openai.OpenAI]:
    """An ``openai`` client of ``oxillama serve`` at ``N_CTX`` on loopback,
    with ``--context-shift --keep KEEP`` when ``shift``; the model is "m"."""
    flags = {"model": str(model_path), "context_size": str(N_CTX), "threads": "2"}
    flags["model_name"] = "m"
    if shift:
        flags |= {"context_shift": "true", "keep": str(KEEP)}
    spec, _ = serve_options_from_mapping(flags)
    app = spec.build()
    with serving_app(app, app.state.server.engine) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
