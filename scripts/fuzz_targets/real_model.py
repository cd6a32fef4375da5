"""The real default model (SmolLM2-135M), loaded once per worker: its
tokenizer, vocabulary and chat template are what the structured targets
run against."""

from __future__ import annotations

import functools

from oxillama import Model
from oxillama.model.paths import default_model_path


@functools.cache
def smollm2() -> Model:
    return Model(default_model_path())
