"""Chat templates: the model's own, rendered as transformers would."""

from __future__ import annotations

from pathlib import Path

import pytest

from oxillama import Engine
from oxillama.chat_template import CHATML, ChatTemplate
from oxillama.errors import TemplateError


def test_smollm2_template_renders_chatml_with_default_system(engine: Engine) -> None:
    text = engine.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = engine.apply_chat_template(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert (
        with_system == "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_chat_continues_the_session_with_prefix_reuse(engine: Engine) -> None:
    msgs = [{"role": "user", "content": "Name a color."}]
    first = engine.chat(msgs, 8)
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Another."}]
    full = engine.tokenize(engine.apply_chat_template(msgs), add_special=True)
    second = engine.chat(msgs, 8)
    # Only the tokens after the shared prefix were evaluated for the new turn.
    assert 0 < second.timings.prompt_tokens < len(full) // 2
    assert engine.tokens[: len(full)] == full


def test_fallback_and_errors() -> None:
    t = ChatTemplate.from_metadata({})
    assert t.source == CHATML
    assert t.render([{"role": "user", "content": "x"}]) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(TemplateError, match="nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render([])
    with pytest.raises(TemplateError, match="invalid"):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError, match="role"):
        t.render([{"content": "no role"}])
    # The sandbox refuses attribute access to internals.
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])


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
