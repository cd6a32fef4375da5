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
