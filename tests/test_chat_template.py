"""Chat templates: the model's own, rendered as transformers would, checked
against strings written out by hand and against llama-cpp-python's
renderings (tests/reference/chat_smollm2.json, made by make_reference.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oxillama import Engine
from oxillama.errors import OxiLlamaError, TemplateError
from oxillama.text.chat_template import CHATML, ChatTemplate
from tests._gguf_meta import ModelMissing, gemma3_path, read_metadata, smollm2_path

REF = Path(__file__).parent / "reference"
SMOL_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n"
)


@pytest.fixture(scope="module")
def smol_meta() -> dict[str, Any]:
    try:
        return read_metadata(smollm2_path())
    except ModelMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def smol(smol_meta: dict[str, Any]) -> ChatTemplate:
    return ChatTemplate.from_metadata(smol_meta)


def test_smollm2_template_renders_exact_chatml(smol: ChatTemplate) -> None:
    assert (smol.bos_token, smol.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert smol.render([{"role": "user", "content": "Hi"}]) == (
        SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert smol.render(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    ) == ("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    multi = [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another."},
    ]
    assert smol.render(multi) == (
        SMOL_SYSTEM + "<|im_start|>user\nName a color.<|im_end|>\n"
        "<|im_start|>assistant\nBlue.<|im_end|>\n"
        "<|im_start|>user\nAnother.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_matches_llama_cpp_python() -> None:
    """Renderings recorded from llama-cpp-python's Jinja2ChatFormatter."""
    cases = json.loads((REF / "chat_smollm2.json").read_text("utf-8"))
    assert len(cases) >= 5
    meta = read_metadata(smollm2_path())
    t = ChatTemplate.from_metadata(meta)
    for c in cases:
        got = t.render(c["messages"], add_generation_prompt=c["add_generation_prompt"])
        assert got == c["text"]


def test_template_environment_as_transformers() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}"
        "{% generation %}{{ m.content }}{% endgeneration %}"
        "{% if loop.index == 2 %}{% break %}{% endif %}{% endfor %}|"
        "{{ {'k': '\u00e9'} | tojson }}|{{ [1, 2] | tojson(separators=(',', ':')) }}|"
        "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|"
        "{{ strftime_now('%Y') | length }}|{{ tools }}|{{ documents }}|{{ flag }}|{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    msgs = [{"role": "user", "content": c} for c in "xyz"]
    assert t.render(msgs, flag="on") == (
        '<s>xy|{"k": "\u00e9"}|[1,2]|{"a": 2, "b": 1}|4|None|None|on|</s>'
    )
    # Extra variables may override the special-token texts.
    assert t.render([], eos_token="E").endswith("|E")
    assert t.render([], tools=[{"name": "f"}]).count("{'name': 'f'}") == 1


def test_gemma_has_no_template_and_gets_chatml() -> None:
    try:
        meta = read_metadata(gemma3_path())
    except ModelMissing as e:
        pytest.fail(str(e), pytrace=False)
    assert "tokenizer.chat_template" not in meta
    t = ChatTemplate.from_metadata(meta)
    assert t.source == CHATML and (t.bos_token, t.eos_token) == ("<bos>", "<eos>")
    assert t.special_tokens["pad_token"] == "<pad>"
    assert ChatTemplate.from_metadata(meta, fallback=False) is None


def test_fallback_and_errors() -> None:
    t = ChatTemplate.from_metadata({})
    assert t.source == CHATML
    assert t.render([{"role": "user", "content": "x"}]) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ChatTemplate.from_metadata({"tokenizer.chat_template": "  "}).source == CHATML
    assert issubclass(TemplateError, OxiLlamaError)
    with pytest.raises(TemplateError, match="nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render([])
    with pytest.raises(TemplateError, match="invalid"):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError, match="role"):
        t.render([{"content": "no role"}])
    with pytest.raises(TemplateError, match="sequence"):
        t.render("hello")  # type: ignore[arg-type]
    # Python errors inside the template: None + str.
    with pytest.raises(TemplateError, match="TypeError"):
        t.render([{"role": "user", "content": None}])
    # Undefined things called, unknown filters at compile time.
    with pytest.raises(TemplateError):
        ChatTemplate("{{ nothing.method() }}").render([])
    with pytest.raises(TemplateError, match="invalid"):
        ChatTemplate("{{ x | no_such_filter }}")
    # The sandbox refuses internals and mutation.
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages.append(1) }}").render([])


# ----------------------------------------------------------- the engine


def test_engine_renders_the_models_template(engine: Engine) -> None:
    text = engine.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_continues_the_session_with_prefix_reuse(engine: Engine) -> None:
    msgs = [{"role": "user", "content": "Name a color."}]
    first = engine.chat(msgs, 8)
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Another."}]
    full = engine.tokenize(engine.apply_chat_template(msgs), add_special=True)
    second = engine.chat(msgs, 8)
    # Only the tokens after the shared prefix were evaluated for the new turn.
    assert 0 < second.timings.prompt_tokens < len(full) // 2
    assert engine.tokens[: len(full)] == full


def test_tokenizer_path_overrides_gguf_vocab(
    model_path: Path, tmp_path: Path, engine: Engine
) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(engine.tokenizer.hf.to_str())
    e2 = Engine(model_path, context_size=64, threads=1, tokenizer_path=path)
    text = "Override: <|im_start|>user 123"
    assert e2.tokenize(text) == engine.tokenize(text)
    with pytest.raises(Exception, match="cannot load tokenizer"):
        Engine(model_path, context_size=64, tokenizer_path=tmp_path / "missing.json")
