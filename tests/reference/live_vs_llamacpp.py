"""Live fuzzing of the tokenizer and chat templates against llama.cpp itself.

Not part of the test suite: it needs llama-cpp-python, whose source build
takes about ten minutes, and the suite never skips. The committed reference
files (made by make_reference.py) carry the same checks into CI; run this
by hand after changing the tokenizer or the template renderer:

    pip install llama-cpp-python
    python -m tests.reference.live_vs_llamacpp

The real vocabularies need ``python scripts/fetch_vocabs.py`` first.
"""

from __future__ import annotations

import random
from pathlib import Path

from oxillama.text.chat_template import CHATML, ChatTemplate
from oxillama.text.tokenizer import Tokenizer
from tests._gguf_meta import gemma3_path, read_metadata, smollm2_path


def fuzz_tokenizer(model_paths: dict[str, Path], n: int = 300) -> int:
    """Random texts, special tokens included; returns how many were checked."""
    import llama_cpp

    rng = random.Random(7)
    alphabet = "ab Z09 \t\n'!?<>|_-\u00e9\u65e5\U0001f600\u200d\x04"
    specials = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<b>", "  ", "\n\n"]
    checked = 0
    for model, path in model_paths.items():
        ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        tok = Tokenizer.from_gguf_metadata(read_metadata(path))
        for _ in range(n):
            parts = [
                rng.choice(specials)
                if rng.random() < 0.2
                else "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
                for _ in range(rng.randint(0, 5))
            ]
            text, special = "".join(parts), rng.random() < 0.5
            want = ll.tokenize(text.encode(), add_bos=False, special=special)
            got = tok.encode(text, parse_special=special)
            assert got == want, (model, text, special, got, want)
            checked += 1
    return checked


TEMPLATES = [
    CHATML,
    # Gemma-style: bos, roles renamed, loop controls, raise_exception.
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role') }}"
    "{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    # Whitespace control: trim_blocks / lstrip_blocks.
    "{% for m in messages %}\n    {% if m.role == 'user' %}\nU: {{ m.content }}\n"
    "    {% else %}\nA: {{ m.content }}\n    {% endif %}\n{% endfor %}",
    # tojson with non-ASCII text, tools.
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% for m in messages %}{{ m | tojson(indent=2) }}{% endfor %}",
]


def compare_templates() -> int:
    """Renders through llama-cpp-python's Jinja2ChatFormatter and ours."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    templates = [read_metadata(smollm2_path())["tokenizer.chat_template"], *TEMPLATES]
    conversations = [
        [{"role": "user", "content": " Hi \u00e9\u65e5 "}],
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c\n"},
        ],
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": "\u00fc"}}]
    checked = 0
    for source in templates:
        for messages in conversations:
            for agp in (True, False):
                ref = Jinja2ChatFormatter(source, "</s>", "<s>", add_generation_prompt=agp)
                want = ref(messages=messages, tools=tools).prompt  # type: ignore[arg-type]
                ours = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
                assert ours.render(messages, add_generation_prompt=agp, tools=tools) == want
                checked += 1
    return checked


def fuzz_vocabularies(n: int = 2000) -> int:
    """Random texts (special tokens, pieces of the vocabulary, Unicode spaces
    and marks) through each real vocabulary of test_tokenizer_vocabs.py,
    with BOS and special-token parsing on and off at random."""
    import llama_cpp

    from tests._vocab_files import FETCH, vocab_metadata
    from tests.test_tokenizer_vocabs import SUPPORTED

    rng = random.Random(11)
    alphabet = (
        "ab Z09 \t\n\r'!?.,<>|_-$\u00e9\u0301\u0915\u093f\u65e5\uac00"
        "\U0001f600\u200d\u00a0\u3000\x04"
    )
    checked = 0
    for name in SUPPORTED:
        tok = Tokenizer.from_gguf_metadata(vocab_metadata(name))
        ll = llama_cpp.Llama(str(FETCH.vocab_path(name)), vocab_only=True, verbose=False)
        specials = [tok.decode([i]) for i in range(tok.vocab_size) if tok.is_special(i)][:50]
        words = [tok.decode([i]) for i in rng.sample(range(tok.vocab_size), 300)]
        for _ in range(n):
            parts = []
            for _ in range(rng.randint(0, 6)):
                r = rng.random()
                if r < 0.15:
                    parts.append(rng.choice([*specials, "  ", "\n\n"]))
                elif r < 0.5:
                    parts.append(rng.choice(words))
                else:
                    parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))))
            text, special, add = "".join(parts), rng.random() < 0.5, rng.random() < 0.3
            want = ll.tokenize(text.encode(), add_bos=add, special=special)
            got = tok.encode(text, add_special=add, parse_special=special)
            assert got == want, (name, text, special, add, got, want)
            checked += 1
    return checked


def main() -> None:
    paths = {"smollm2": smollm2_path(), "gemma3": gemma3_path()}
    print(f"tokenizer: {fuzz_tokenizer(paths)} random texts equal to llama.cpp")
    print(f"real vocabularies: {fuzz_vocabularies()} random texts equal to llama.cpp")
    print(f"chat templates: {compare_templates()} renderings equal to llama-cpp-python")


if __name__ == "__main__":
    main()
