"""JSON Schema constrained generation on the real SmolLM2: for random schemas
built from the supported keywords, whatever the model writes validates
(checked by `jsonschema`, an independent validator)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from oxillama import Engine, SamplerConfig

NAMES = ["id", "name", "kind", "size", "ok", "tags", "when", "mail", "note"]


def leaf() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(
            lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
            st.integers(-50, 50),
            st.integers(0, 200),
        ),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 12)),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.just({"type": "number", "minimum": 0, "maximum": 10}),
        st.lists(
            st.sampled_from(["red", "green", "blue", 1, None]), min_size=1, max_size=3, unique=True
        ).map(lambda xs: {"enum": xs}),
        st.sampled_from(
            [
                {"type": "string", "format": "date"},
                {"type": "string", "format": "uuid"},
                {"type": "string", "format": "email"},
                {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
                {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
                {"const": "fixed"},
            ]
        ),
    )


def schemas() -> st.SearchStrategy[dict[str, Any]]:
    def obj(props: dict[str, dict[str, Any]], req: list[bool]) -> dict[str, Any]:
        names = list(props)
        return {
            "type": "object",
            "properties": props,
            "required": [n for n, r in zip(names, req, strict=True) if r],
            "additionalProperties": False,
        }

    inner = st.recursive(
        leaf(),
        lambda child: st.one_of(
            st.builds(
                lambda items, n: {"type": "array", "items": items, "maxItems": n},
                child,
                st.integers(0, 3),
            ),
            st.dictionaries(st.sampled_from(NAMES), child, min_size=1, max_size=3).flatmap(
                lambda p: st.lists(st.booleans(), min_size=len(p), max_size=len(p)).map(
                    lambda r: obj(p, r)
                )
            ),
            st.lists(child, min_size=2, max_size=2).map(lambda xs: {"anyOf": xs}),
        ),
        max_leaves=4,
    )
    return st.dictionaries(st.sampled_from(NAMES), inner, min_size=1, max_size=3).flatmap(
        lambda p: st.lists(st.booleans(), min_size=len(p), max_size=len(p)).map(lambda r: obj(p, r))
    )


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Engine:
    return Engine(model_path, context_size=512, threads=2)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=schemas(), seed=st.integers(0, 2**31), greedy=st.booleans())
def test_random_schemas_yield_valid_documents(
    engine: Engine, schema: dict[str, Any], seed: int, greedy: bool
) -> None:
    engine.reset()
    cfg = SamplerConfig.greedy() if greedy else SamplerConfig(temperature=1.0, seed=seed)
    out = engine.generate("JSON:", 160, json_schema=schema, sampler=cfg)
    # Even a document cut by max_tokens is complete: the grammar budget
    # closes it in time.
    jsonschema.validate(json.loads(out.text), schema)


class Pet(BaseModel):
    name: str = Field(max_length=16)
    legs: int = Field(ge=0, le=8)
    kind: str = Field(pattern="^(cat|dog|bird)$")


def test_pydantic_models_are_schemas(engine: Engine) -> None:
    engine.reset()
    out = engine.chat(
        [{"role": "user", "content": "Describe a pet as JSON."}],
        80,
        json_schema=Pet,
        sampler=SamplerConfig(temperature=0.7, seed=5),
    )
    assert out.finish_reason != "length", out.text
    pet = Pet.model_validate_json(out.text)
    assert 0 <= pet.legs <= 8 and pet.kind in ("cat", "dog", "bird")
