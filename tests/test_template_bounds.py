"""Chat templates come from the GGUF, so from whoever made the file: every
way a sandboxed template can burn time or memory ends in a TemplateError,
within the time bound and without the memory first; legitimate templates
render exactly as the unbounded jinja2 sandbox renders them."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from typing import Any

import jinja2.ext
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from oxillama.errors import ParameterError, TemplateError
from oxillama.text.chat_template import CHATML, ChatTemplate, TemplateLimits, _GenerationTag
from tests._chat_templates import FAMILIES
from tests._gguf_meta import ModelMissing, read_metadata, smollm2_path

# Small bounds keep each refusal quick; the mechanisms are the defaults'.
SMALL = TemplateLimits(
    max_seconds=0.25, max_output_chars=1 << 16, max_items=1 << 14, max_alloc_bytes=1 << 21
)
# Generous: a refusal must come well before a hang would end on its own
# (without the bounds, each case below runs for minutes or exhausts memory).
WALL = 10.0
# Peak Python allocation allowed while refusing (SMALL allows 2 MiB).
PEAK = 16 << 20
MSGS = [{"role": "user", "content": "hi"}]

NS = "{% set ns = namespace(x=X) %}"
LOOP = "{% for i in range(60) %}BODY{% endfor %}"

HOSTILE = {
    # output and size operators
    "str-times": "{{ 'x' * 1000000000 }}",
    "list-times": "{{ [1, 2] * 1000000000 }}",
    "int-pow": "{{ 2 ** 100000000 }}",
    "int-times-growth": NS.replace("X", "3") + LOOP.replace("BODY", "{% set ns.x = ns.x * ns.x %}"),
    "str-plus-doubling": NS.replace("X", "'a'")
    + LOOP.replace("BODY", "{% set ns.x = ns.x + ns.x %}"),
    "tilde-doubling": NS.replace("X", "'a'") + LOOP.replace("BODY", "{% set ns.x = ns.x ~ ns.x %}"),
    "list-plus-doubling": NS.replace("X", "[1]")
    + LOOP.replace("BODY", "{% set ns.x = ns.x + ns.x %}"),
    # values that share themselves: tiny in memory, exponential when printed
    "shared-list-print": NS.replace("X", "[1]")
    + LOOP.replace("BODY", "{% set ns.x = [ns.x, ns.x] %}")
    + "{{ ns.x }}",
    "shared-tuple-json": NS.replace("X", "(1,)")
    + LOOP.replace("BODY", "{% set ns.x = (ns.x, ns.x) %}")
    + "{{ ns.x | tojson }}",
    "shared-dict": NS.replace("X", "{}")
    + LOOP.replace("BODY", "{% set ns.x = dict(a=ns.x, b=ns.x) %}"),
    "shared-namespace": NS.replace("X", "1")
    + LOOP.replace("BODY", "{% set ns.x = namespace(a=ns.x, b=ns.x) %}"),
    "fromkeys": "{{ {}.fromkeys(range(100000), 'x' * 60000) | length }}",
    # time: loops without output, recursion
    "nested-loops": "{% for a in range(100000) %}{% for b in range(100000) %}"
    "{% endfor %}{% endfor %}",
    "nested-loops-output": "{% for a in range(100000) %}{% for b in range(100000) %}x"
    "{% endfor %}{% endfor %}",
    "filtered-loops": "{% for a in range(100000) %}{% for b in range(100000) if false %}"
    "{% endfor %}{% endfor %}",
    "set-block-loops": "{% set s %}{% for a in range(100000) %}{% for b in range(100000) %}"
    "x{% endfor %}{% endfor %}{% endset %}",
    "macro-exponential": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}"
    "{% endif %}{% endmacro %}{{ f(60) }}",
    "macro-infinite": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "recursive-loop": "{% for i in range(100000) recursive %}{{ loop(range(100000)) }}{% endfor %}",
    "range-too-big": "{{ range(10 ** 9) | list | length }}",
    # filters and methods with size arguments
    "center-filter": "{{ 'x' | center(1000000000) }}",
    "center-method": "{{ 'x'.center(1000000000) }}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
    "zfill": "{{ '1'.zfill(1000000000) }}",
    "indent": "{{ 'a\\nb' | indent(1000000000) }}",
    "wordwrap": "{{ 'a b c d' | wordwrap(1, wrapstring='x' * 60000) }}",
    "replace-filter": "{{ 'abcdefgh' | replace('', 'x' * 60000) }}",
    "replace-method": "{{ 'abcdefgh'.replace('', 'x' * 60000) }}",
    "expandtabs": "{{ ('\\t' * 100).expandtabs(1000000000) }}",
    "translate": "{{ 'aaaa'.translate({97: 'x' * 60000}) }}",
    "printf-width": "{{ '%1000000000d' % 1 }}",
    "printf-star": "{{ '%*d' % (1000000000, 1) }}",
    "format-filter": "{{ '%1000000000s' | format('x') }}",
    "str-format": "{{ '{:>1000000000}'.format('x') }}",
    "str-format-nested": "{{ '{:>{w}}'.format('x', w=1000000000) }}",
    "str-format-repeat": "{{ ('{0}' * 1000).format('x' * 60000) }}",
    "join-filter": "{{ (['x' * 60000] * 100) | join }}",
    "join-method": "{{ ''.join(['x' * 60000] * 100) }}",
    "batch-fill": "{{ [1] | batch(1000000000, 'x') | list | length }}",
    "slice-fill": "{{ [1] | slice(1000000000, 'x') | list | length }}",
    "round-precision": "{{ 5 | round(-1000000000) }}",
    "round-floor": "{{ 5 | round(-100000, 'floor') }}",
    "to-bytes": "{{ (1).to_bytes(1000000000, 'big') | length }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "tojson-indent": "{{ [[1]] | tojson(indent=1000000000) }}",
    "sum-lists": "{{ ([[1] * 1000] * 1000) | sum(start=[]) | length }}",
    "unique-huge": "{{ ('x' * 60000) | list | unique | list | length }}",
    "strftime": "{{ strftime_now('%c' * 100000) }}",
    # memory: bounded values kept alive in a loop
    "keep-alive-list": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + ['x' * 60000 ~ i] %}{% endfor %}",
    "keep-alive-chain": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = [ns.l, 'x' * 60000 ~ i] %}{% endfor %}",
    "upper-in-loop": "{% for i in range(100000) %}{% set x = ('x' * 60000) | upper %}{% endfor %}",
    "map-center": "{{ range(10000) | map('center', 60000) | list | length }}",
    "deep-parens": "{{ " + "(" * 400 + "1" + ")" * 400 + " }}",
    "deep-ifs": "{% if 1 %}" * 300 + "{% endif %}" * 300,
}


def _refuses(source: str, limits: TemplateLimits = SMALL) -> TemplateError:
    """Compiles and renders ``source``: it must end in a TemplateError."""
    t0 = time.monotonic()
    with pytest.raises(TemplateError) as info:
        ChatTemplate(source, limits=limits).render(MSGS)
    assert time.monotonic() - t0 < WALL
    return info.value


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_refused_in_bounded_time_and_memory(name: str) -> None:
    tracemalloc.start()
    try:
        err = _refuses(HOSTILE[name])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK, f"{name}: peak {peak:,} bytes before {err}"
    assert str(err)


def test_each_bound_names_itself() -> None:
    assert "longer than its limit of 0.25 s" in str(_refuses(HOSTILE["nested-loops"]))
    assert "over the limit of 65,536" in str(_refuses(HOSTILE["str-times"]))
    assert "16,384 items" in str(_refuses(HOSTILE["batch-fill"]))
    assert "2,097,152 bytes" in str(_refuses(HOSTILE["upper-in-loop"]))


def test_default_limits_stop_the_issues_examples() -> None:
    """The issue's two cases, with the default bounds (1 s, 4 Mi chars)."""
    t0 = time.monotonic()
    for source in (HOSTILE["str-times"], HOSTILE["nested-loops-output"]):
        with pytest.raises(TemplateError):
            ChatTemplate(source).render(MSGS)
    assert time.monotonic() - t0 < WALL


def test_output_bound_is_exact() -> None:
    limits = TemplateLimits(max_output_chars=1000)
    source = "{% for i in range(n) %}x{% endfor %}"
    assert ChatTemplate(source, limits=limits).render([], n=1000) == "x" * 1000
    with pytest.raises(TemplateError, match="rendered prompt"):
        ChatTemplate(source, limits=limits).render([], n=1001)
    with pytest.raises(TemplateError, match="characters"):
        ChatTemplate("x" * 1001, limits=limits)


def test_limits_are_validated() -> None:
    for bad in (
        {"max_seconds": 0},
        {"max_seconds": float("inf")},
        {"max_output_chars": -1},
        {"max_items": 1.5},
        {"max_alloc_bytes": True},
    ):
        with pytest.raises(ParameterError):
            TemplateLimits(**bad)
    with pytest.raises(TemplateError, match="TemplateLimits"):
        ChatTemplate(CHATML, limits={"max_seconds": 1})  # type: ignore[arg-type]


def test_a_refused_render_leaves_the_template_usable_and_threads_apart() -> None:
    slow = ChatTemplate(HOSTILE["nested-loops"], limits=SMALL)
    fast = ChatTemplate(CHATML)
    results: list[Any] = []

    def run_slow() -> None:
        try:
            slow.render(MSGS)
        except TemplateError as e:
            results.append(e)

    th = threading.Thread(target=run_slow)
    th.start()
    # Meanwhile another thread's renders have their own budget.
    for _ in range(200):
        assert fast.render(MSGS).startswith("<|im_start|>user")
    th.join()
    assert len(results) == 1 and "longer than" in str(results[0])
    assert fast.render(MSGS).endswith("<|im_start|>assistant\n")


# --------------------------------------------- legitimate templates unchanged


def _reference_env() -> ImmutableSandboxedEnvironment:
    """The sandbox as it was before the bounds: the reference rendering."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )

    def tojson(v: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(v, ensure_ascii=ensure_ascii, indent=indent, **kw)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def _smollm2() -> str:
    try:
        source = read_metadata(smollm2_path())["tokenizer.chat_template"]
    except ModelMissing as e:
        pytest.fail(str(e), pytrace=False)
    assert isinstance(source, str)
    return source


TEMPLATES = {"chatml": CHATML, **FAMILIES}
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
_tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.from_regex(r"[a-z_]{1,8}", fullmatch=True), "description": _text}
        ),
    }
)
_call = st.fixed_dictionaries(
    {
        "function": st.fixed_dictionaries(
            {
                "name": st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
                "arguments": st.dictionaries(_text, st.one_of(_text, st.integers()), max_size=3),
            }
        )
    }
)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(_text)})
    for i in range(draw(st.integers(0, 6))):
        role = "user" if i % 2 == 0 else "assistant"
        if draw(st.integers(0, 9)) == 0:
            role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
        m: dict[str, Any] = {"role": role, "content": draw(_text)}
        if role == "assistant" and draw(st.booleans()):
            m["tool_calls"] = draw(st.lists(_call, max_size=2))
        out.append(m)
    return out


def _render_both(
    source: str, messages: list[dict[str, Any]], tools: Any = None, gen: bool = True
) -> tuple[str, str]:
    """Ours and the unbounded sandbox's rendering, or "error" for a failure
    (the unbounded one raises jinja2 and Python errors; ours wraps them)."""
    try:
        ours = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
            messages, add_generation_prompt=gen, tools=tools
        )
    except TemplateError:
        ours = "error"
    try:
        ref = (
            _reference_env()
            .from_string(source)
            .render(
                messages=messages,
                bos_token="<s>",
                eos_token="</s>",
                add_generation_prompt=gen,
                tools=tools,
                documents=None,
            )
        )
    except Exception:
        ref = "error"
    return ours, ref


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(TEMPLATES)),
    messages=conversations(),
    tools=st.one_of(st.none(), st.lists(_tool, min_size=1, max_size=2)),
    gen=st.booleans(),
)
def test_family_templates_render_as_the_unbounded_sandbox(
    name: str, messages: list[dict[str, Any]], tools: Any, gen: bool
) -> None:
    ours, ref = _render_both(TEMPLATES[name], messages, tools, gen)
    assert ours == ref


def test_smollm2_template_renders_as_the_unbounded_sandbox() -> None:
    source = _smollm2()
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi \u00e9\U0001f600"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "x" * 100_000},
    ]
    for messages in (conv, conv[1:], []):
        ours, ref = _render_both(source, messages)
        assert ours == ref and ours != "error"


def test_long_legitimate_conversation_fits_the_default_bounds() -> None:
    """A 2,000-turn chat with 1 MiB of text renders under the defaults with
    every family's template (quadratic idioms included)."""
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w" * 500}
        for i in range(2000)
    ]
    for name, source in TEMPLATES.items():
        ours, ref = _render_both(source, messages)
        assert ours == ref and ours != "error", name


# ----------------------------------------------------- mutated templates

FRAGMENTS = [*HOSTILE.values(), "{{ messages | tojson }}", "{% if %}", "{{", "{% endfor %}"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(sorted(TEMPLATES)),
    cut=st.integers(0, 10_000),
    fragment=st.sampled_from(FRAGMENTS),
    messages=conversations(),
)
def test_mutated_templates_end_in_a_prompt_or_a_template_error(
    base: str, cut: int, fragment: str, messages: list[dict[str, Any]]
) -> None:
    source = TEMPLATES[base]
    at = cut % (len(source) + 1)
    mutated = source[:at] + fragment + source[at:]
    t0 = time.monotonic()
    try:
        out = ChatTemplate(mutated, limits=SMALL).render(messages)
    except TemplateError:
        pass
    else:
        assert isinstance(out, str) and len(out) <= SMALL.max_output_chars
    assert time.monotonic() - t0 < WALL
