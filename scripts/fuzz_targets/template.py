"""template: chat template rendering with the template a GGUF carries,
SmolLM2's real one and mutations of it (Jinja fragments spliced in at
random places, slices cut out), on random messages and template variables.
A template comes from whoever made the file, so whatever it does must end
in a prompt or a `TemplateError`, in bounded time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from oxillama.text.chat_template import ChatTemplate
from oxillama.text.template_limits import TemplateLimits

from . import JsonTarget
from .real_model import smollm2

# The default limits but a tenth of the time: a hostile template runs until
# its time bound, and at the default 1 s, 2,000 inputs would not fit CI's
# budget. Every other bound is the default one users get.
LIMITS = TemplateLimits(max_seconds=0.1)

# Pieces a hostile or broken template might hold: huge outputs, nested
# loops, deep recursion, sandbox escapes, errors, undefined names.
FRAGMENTS = [
    "{{ 'x' * 1000000000 }}",
    "{{ 'ab' * 100000 }}",
    "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for n in messages %}{{ n.content }}{% endfor %}{% endfor %}",
    "{{ range(10**9) | list | length }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ raise_exception('bad input') }}",
    "{{ undefined_name.attr }}",
    "{{ messages[100]['content'] }}",
    "{% set ns = namespace(x=[]) %}{% for i in range(50) %}{% set ns.x = ns.x + ns.x + [i] %}"
    "{% endfor %}{{ ns.x | length }}",
    "{{ messages | tojson }}",
    "{{ tools | tojson(indent=2) }}",
    "{{ strftime_now('%Y') }}",
    "{% generation %}x{% endgeneration %}",
    "{{ (messages[0]['content'] * 1000) | length }}",
    "{{ 9 ** 9 ** 9 }}",
    "{% if %}",
    "{{",
    "{% endfor %}",
    "{{ bos_token }}{{ eos_token }}",
    "{% for m in messages %}{{ m['role'] | upper }}{% endfor %}",
]

_scalar = st.one_of(
    st.text(max_size=40), st.integers(), st.floats(allow_nan=False), st.booleans(), st.none()
)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", ""]) | st.text(max_size=8)},
    optional={
        "content": st.one_of(
            st.text(max_size=200),
            st.none(),
            st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}),
                max_size=3,
            ),
            _json,
        ),
        "name": st.text(max_size=10),
        "tool_calls": _json,
    },
)


def _boundaries(source: str) -> list[int]:
    """Offsets between two tags, where a spliced fragment keeps the
    template valid (elsewhere it mostly makes a syntax error)."""
    ends = [i + 2 for i in range(len(source) - 1) if source[i : i + 2] in ("}}", "%}")]
    return [0, *ends, len(source)]


@st.composite
def _template(draw: st.DrawFn, real: str) -> str:
    source = real
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            i = draw(st.sampled_from(_boundaries(source)))
            source = source[:i] + draw(st.sampled_from(FRAGMENTS)) + source[i:]
        elif draw(st.booleans()):
            i = draw(st.integers(0, len(source)))
            source = source[:i] + draw(st.sampled_from(FRAGMENTS)) + source[i:]
        else:
            i = draw(st.integers(0, len(source)))
            source = source[:i] + source[i + draw(st.integers(1, 40)) :]
    return source


class TemplateTarget(JsonTarget):
    name = "template"

    def __init__(self) -> None:
        self.metadata = dict(smollm2().metadata)
        real = str(self.metadata["tokenizer.chat_template"])
        self.strategy = st.fixed_dictionaries(
            {
                "template": _template(real),
                "messages": st.lists(_message, max_size=6),
                "add_generation_prompt": st.booleans(),
                "variables": st.dictionaries(
                    st.sampled_from(["tools", "documents", "enable_thinking", "bos_token"]),
                    _json,
                    max_size=2,
                ),
            }
        )

    def setup(self, workdir: Path) -> None:
        self.tokenizer = smollm2().tokenizer

    def run(self, value: Any) -> None:
        meta = dict(self.metadata, **{"tokenizer.chat_template": value["template"]})
        template = ChatTemplate.from_metadata(meta)
        template.limits = LIMITS
        prompt = template.render(
            value["messages"],
            add_generation_prompt=value["add_generation_prompt"],
            **value["variables"],
        )
        self.tokenizer.encode(prompt[:4096])


TARGETS = {"template": TemplateTarget}
