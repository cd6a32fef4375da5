#!/usr/bin/env bash
# Builds oxillama's binary wheel for x86-64 Linux the same way every time:
# one wheel for CPython 3.10 and every later version (the stable ABI,
# abi3), for any distribution with glibc 2.28 or newer (manylinux_2_28),
# and every x86-64 CPU (SIMD kernels are chosen at run time, never at build
# time). Zig links against glibc 2.28's symbol versions, so the wheel is
# the same whichever distribution builds it. Usage:
#   bash scripts/build_wheel.sh [OUT_DIR]     (default: dist/)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OUT=${1:-dist}
"$PY" -m pip install --quiet --disable-pip-version-check "maturin>=1.7,<2" "ziglang" "auditwheel>=6"
# A portable wheel: no -C target-cpu=native from the environment.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS
rm -f "$OUT"/oxillama-*.whl
"$PY" -m maturin build --release --zig --compatibility manylinux_2_28 --out "$OUT"
wheel=$(ls "$OUT"/oxillama-*.whl)
# auditwheel reads the wheel's ELF files: the highest glibc symbol version
# they need and any library outside the manylinux set.
"$PY" -m auditwheel show "$wheel"
echo "$wheel: $(du -h "$wheel" | cut -f1)"
