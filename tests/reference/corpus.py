"""Inputs for the llama.cpp reference data (shared by the generator and tests)."""

TOKEN_TEXTS = [
    "Hello world",
    "",
    " ",
    "   ",
    "\t\t tabs and  double  spaces",
    "line one\nline two\n\n\nline five\r\nwindows",
    "Numbers: 0 7 42 1234567890 3.14159 -273.15 1e-9 0x1F",
    "Prices $12.99, €7,50 and ¥1000 (approx.)",
    "café naïve résumé Ångström façade",
    "日本語のテキストを分割します。",
    "中文分词测试：你好，世界！",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Привет, мир! Как дела?",
    "emoji 🎉🔥 and ZWJ 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    'fn main() { let v: Vec<u32> = (0..10).collect(); println!("{:?}", v); }',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    '<div class="x">&nbsp;<b>bold</b></div>',
    "https://example.com/path?query=a+b&x=%20y#frag",
    "user@example.org, +1 (555) 010-9999",
    "I'm sure you're right, they'll see it's fine; we'd've known.",
    "ALL CAPS SHOUTING and MiXeD cAsE",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> in the middle",
    "<repo_name>oxillama<file_sep>src/main.rs",
    "a\u00a0non-breaking\u2009thin\u200bzero-width",
    "trailing spaces   ",
    "   leading spaces",
    "punctuation!!! ??? ... --- ***",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "🙂",
    # Gemma-3's chat markup and its user-defined tokens (runs of spaces,
    # tabs and newlines, HTML tags), which are matched even as plain text.
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <pad><unk><mask>",
    "a  b   c    d     e" + " " * 40 + "f",
    "\n\n\n\t\t\t mixed\r\n\r\n\n\t end",
    "<b>bold</b> <table><tr><td>x</td></tr></table>",
    # More numbers, code and scripts.
    "12345678901234567890 and 3,141,592,653.5897 and 007",
    "const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };",
    '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    'main :: IO ()\nmain = putStrLn "hi" -- comment\n',
    "안녕하세요 세계 สวัสดีชาวโลก Γειά σου κόσμε",
    "👍🏽 1️⃣ ❤️ 🏳️‍🌈 🧑🏿‍💻",
    "∑_{i=1}^{n} i² = n(n+1)/2 ≈ ∞ ≠ ∅",
    "e\u0301 vs \u00e9, \ufb01 ligature, \uff21\uff22 fullwidth",
    "<0x41> looks like a byte token; so does <0xZZ>",
    "Donaudampfschifffahrtsgesellschaftskapitän" + "x" * 50,
    "\ufeffBOM at the start",
]

# Chat and fill-in-the-middle markup of the families whose vocabularies
# tests/reference/vocabs/ checks (make_vocab_reference.py tokenizes these
# after TOKEN_TEXTS), with the whitespace llama.cpp strips around Phi-3's
# special tokens.
FAMILY_MARKUP = [
    "<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n",
    "<|system|>\u3000 sys \xa0<|end|>\x0b<|user|>\t\r\n x</s> \n<s> <unk> y <|endoftext|> z",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "<s>[INST] Hi [/INST] Hello</s>[INST] again [/INST]",
    "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
    "<fim_prefix>def f(x):\n    <fim_suffix>\n    return y<fim_middle>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|><|endoftext|>",
    "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought<channel|>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>User: Hi\n\nAssistant:",
]

# Every Unicode space next to CJK text and CJK punctuation: llama.cpp's
# explicit character ranges (deepseek's) never match a non-ASCII space.
UNICODE_SPACES = [
    " \t\u3000中文 \u3000。\u3001 \t\u3000x - \t\u30000",
    "a\u1680b\u2000c\u2001d\u2002e\u2003f\u2004g\u2005h\u2006i\u2007j\u2008k\u2009l\u200am",
    "文\u2028字\u2029行\u202f中\u205f间\xa0\x85가\u3000\u3000\u3000",
]

PARAGRAPH = (
    "The history of computing is a story of abstraction layered upon abstraction. "
    "Early machines were programmed by rewiring their circuits; later, stored programs "
    "let the same hardware run many different tasks. Compilers translated human-readable "
    "code into machine instructions, operating systems shared one computer among many "
    "users, and networks connected computers across the world. Each step hid complexity "
    "behind a simpler interface, so that programmers could think about their problems "
    "instead of the machine."
)

# Conversations rendered with SmolLM2's chat template:
# (messages, add_generation_prompt)
CHATS: list[tuple[list[dict[str, str]], bool]] = [
    ([{"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Hi"}], False),
    ([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}], True),
    (
        [
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another, in Japanese: 日本語で"},
        ],
        True,
    ),
    (
        [
            {"role": "system", "content": "Line one\nline two\n"},
            {"role": "user", "content": "  spaces  and <|im_start|> inside  "},
            {"role": "assistant", "content": ""},
        ],
        False,
    ),
]

# (prompt, wrap in SmolLM2's chat format)
GREEDY_PROMPTS = [
    ("The capital of France is", False),
    ("Once upon a time, in a small village,", False),
    ("def fibonacci(n):", False),
    ("The three primary colors are", False),
    ("Water boils at a temperature of", False),
    ("What is the largest planet in the solar system?", True),
    ("Write a haiku about the sea.", True),
    ("Give me three tips for learning Python.", True),
    ("Translate 'good morning' into Spanish.", True),
    ("Explain photosynthesis in one sentence.", True),
]
