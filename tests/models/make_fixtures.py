"""Writes the tiny random-weight GGUF fixtures (``fixtures/<name>.gguf``) and
llama.cpp's reference outputs for them (``reference/<name>.npz``,
``reference/meta.json``).

    python -m tests.models.make_fixtures             # every fixture
    python -m tests.models.make_fixtures qwen2 phi3  # some of them

The fixtures need only ``gguf`` and numpy; the references need
llama-cpp-python, which CI does not install (the files are committed).
Everything is seeded: re-running on the same llama.cpp build rewrites
identical files."""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import time
import zlib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

if __package__ in (None, ""):  # run as a file rather than with -m
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.models._archs import ALL_FIXTURES, TYPE_FIXTURES, Builder, Fixture
from tests.models._rewrite import rewrite_f32
from tests.models._vocab import VOCAB
from tests.models._weights import FORMATS, assign_formats, best_start, encode

HERE = Path(__file__).parent
FIXTURE_DIR = HERE / "fixtures"
REF_DIR = HERE / "reference"
SEQ_LEN = 64  # teacher-forced tokens, longer than every sliding window
PROMPT_LEN = 8
GREEDY_LEN = 24
THREADS = 2
SEED = 0
TOKEN_SEED = 1234
# What "far from uniform" means here, checked on every reference.
MIN_MEDIAN_MAX_PROB = 0.2
MIN_DISTINCT_ARGMAX = 8
MAX_ARGMAX_IS_INPUT = 0.25


def fixture_path(name: str) -> Path:
    return FIXTURE_DIR / f"{name}.gguf"


def reference_path(name: str, n_ctx_index: int) -> Path:
    return REF_DIR / (f"{name}.npz" if n_ctx_index == 0 else f"{name}_long.npz")


def test_tokens() -> list[int]:
    """BOS, then ordinary tokens; the same sequence for every fixture."""
    rng = np.random.default_rng(TOKEN_SEED)
    return [VOCAB.bos, *(int(t) for t in rng.integers(0, VOCAB.n_normal, SEQ_LEN - 1))]


def write_fixture(fx: Fixture, preferred_start: int) -> tuple[int | None, dict[str, str]]:
    """Writes the file; returns the format cycle's offset (None for a
    one-type fixture) and each tensor's format."""
    rng = np.random.default_rng(zlib.crc32(fx.name.encode()))
    b = Builder(rng)
    w = gguf.GGUFWriter(str(fixture_path(fx.name)), fx.arch)
    # Not the architecture's name: llama.cpp's vocabulary loader changes
    # special-token attributes when general.name contains e.g. "phi3".
    w.add_name("oxillama test fixture")
    if fx.file_type is not None:
        w.add_file_type(fx.file_type)
    fx.build(w, b)
    VOCAB.write(w)
    mats = [t for t in b.tensors if t.matrix]
    start: int | None = None
    if fx.weight_type is not None:
        fmt_of = {t.name: fx.type_of(t.name) for t in mats}
    else:
        cycled = [t for t in mats if fx.experts_type is None or "_exps." not in t.name]
        shapes = [t.data.shape for t in cycled]
        start = best_start(shapes, preferred_start)
        fmt_of = dict(zip((t.name for t in cycled), assign_formats(shapes, start), strict=True))
        if fx.experts_type is not None:
            fmt_of |= {t.name: fx.experts_type for t in mats if "_exps." in t.name}
    formats: dict[str, str] = {}
    for t in b.tensors:
        fmt = fmt_of.get(t.name, Q.F32)
        data = encode(t.data, fmt, rng)
        w.add_tensor(t.name, data, raw_dtype=fmt if data.dtype == np.uint8 else None)
        formats[t.name] = fmt.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return start, formats


def arch_metadata(path: Path, arch: str) -> dict[str, Any]:
    """The architecture's own keys as written, for the implementer's table."""
    out: dict[str, Any] = {}
    for key, f in gguf.GGUFReader(str(path)).fields.items():
        if key.startswith(arch + "."):
            v = f.contents()
            out[key] = float(np.float32(v)) if isinstance(v, float) else v
    return out


def llama(path: Path, n_ctx: int, n_batch: int, kv_f32: bool = False) -> Any:
    import llama_cpp
    from llama_cpp import Llama

    kv_type = llama_cpp.GGML_TYPE_F32 if kv_f32 else llama_cpp.GGML_TYPE_F16
    return Llama(
        str(path),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        seed=SEED,
        flash_attn=False,
        type_k=kv_type,
        type_v=kv_type,
        # llama-cpp-python's own defaults (1.0, 32.0, 1.0) would override
        # the file's YaRN values; -1 means "from the GGUF", as in llama.cpp.
        yarn_attn_factor=-1.0,
        yarn_beta_fast=-1.0,
        yarn_beta_slow=-1.0,
        verbose=False,
    )


def teacher_forced(
    path: Path, n_ctx: int, tokens: list[int], n_batch: int, kv_f32: bool = False
) -> np.ndarray:
    """Logits at every position; ``n_batch`` 1 evaluates one token at a time."""
    llm = llama(path, n_ctx, n_batch, kv_f32)
    llm.eval(tokens)
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    del llm
    return out


def greedy(path: Path, n_ctx: int, prompt: list[int], kv_f32: bool = False) -> list[int]:
    """Argmax continuation, one token per evaluation, no sampler chain."""
    llm = llama(path, n_ctx, 1, kv_f32)
    llm.eval(prompt)
    out: list[int] = []
    for _ in range(GREEDY_LEN):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    del llm
    return out


def softmax_stats(logits: np.ndarray, tokens: list[int]) -> dict[str, float]:
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    top = (p / p.sum(axis=1, keepdims=True)).max(axis=1)
    argmax = logits.argmax(axis=1)
    return {
        "max_prob_median": round(float(np.median(top)), 4),
        "max_prob_min": round(float(top.min()), 4),
        "max_prob_frac_over_0.2": round(float((top > 0.2).mean()), 4),
        "logit_std": round(float(logits.std(axis=1).mean()), 4),
        "distinct_argmax": len(set(argmax.tolist())),
        # A model whose layers barely matter predicts its own input token.
        "argmax_is_input_frac": round(float((argmax == np.array(tokens)).mean()), 4),
    }


def write_reference(fx: Fixture, formats: dict[str, str], n_ctx_index: int) -> dict[str, Any]:
    path = fixture_path(fx.name)
    n_ctx = fx.n_ctx[n_ctx_index]
    tokens = test_tokens()
    batched = teacher_forced(path, n_ctx, tokens, SEQ_LEN)
    single = teacher_forced(path, n_ctx, tokens, 1)
    prompt = tokens[:PROMPT_LEN]
    cont = greedy(path, n_ctx, prompt)
    # The all-F32 rewrite with an F32 KV cache: no quantized activations
    # anywhere, so the sharp check of the architecture's semantics.
    with tempfile.TemporaryDirectory() as tmp:
        f32_path = Path(tmp) / "f32.gguf"
        f32_sha = rewrite_f32(path, f32_path)
        f32 = teacher_forced(f32_path, n_ctx, tokens, SEQ_LEN, kv_f32=True)
        f32_single = teacher_forced(f32_path, n_ctx, tokens, 1, kv_f32=True)
        cont_f32 = greedy(f32_path, n_ctx, prompt, kv_f32=True)
    stats = softmax_stats(batched, tokens)
    if (
        stats["max_prob_median"] < MIN_MEDIAN_MAX_PROB
        or stats["distinct_argmax"] < MIN_DISTINCT_ARGMAX
        or stats["argmax_is_input_frac"] > MAX_ARGMAX_IS_INPUT
    ):
        raise SystemExit(f"{fx.name}: logits too close to uniform or constant: {stats}")
    # A one-type fixture has no float matrix, so llama.cpp's two paths
    # often agree to the last bit and its noise says little; the same
    # logits with an F32 KV cache, where neither engine rounds the cache,
    # show each type's kernels bit for bit between activation roundings.
    kv_f32: dict[str, Any] = {}
    if fx.weight_type is not None:
        kv_f32["logits_kv_f32"] = teacher_forced(path, n_ctx, tokens, SEQ_LEN, kv_f32=True)
        kv_f32["logits_kv_f32_single"] = teacher_forced(path, n_ctx, tokens, 1, kv_f32=True)
    out = reference_path(fx.name, n_ctx_index)
    np.savez_compressed(
        out,
        **kv_f32,
        tokens=np.array(tokens, dtype=np.int32),
        logits_batched=batched,
        logits_single=single,
        greedy_prompt=np.array(prompt, dtype=np.int32),
        greedy_tokens=np.array(cont, dtype=np.int32),
        logits_f32=f32,
        greedy_tokens_f32=np.array(cont_f32, dtype=np.int32),
        f32_sha256=np.array(f32_sha),
        n_ctx=np.int32(n_ctx),
        tensor_names=np.array(list(formats)),
        tensor_formats=np.array(list(formats.values())),
    )
    return {
        "file": out.name,
        "n_ctx": n_ctx,
        "batched_vs_single_max_abs": round(float(np.abs(batched - single).max()), 6),
        "batched_vs_single_mean_abs": round(float(np.abs(batched - single).mean()), 7),
        "argmax_agreement": float((batched.argmax(1) == single.argmax(1)).mean()),
        "f32_sha256": f32_sha,
        "f32_batched_vs_single_max_abs": float(f"{np.abs(f32 - f32_single).max():.3g}"),
        # What quantizing activations alone moves, on the same weights.
        "f32_vs_quantized_max_abs": round(float(np.abs(f32 - batched).max()), 6),
        "f32_vs_quantized_argmax_agreement": float((f32.argmax(1) == batched.argmax(1)).mean()),
        "softmax": stats,
        **(
            {
                "kv_f32_batched_vs_single_max_abs": round(
                    float(np.abs(kv_f32["logits_kv_f32"] - kv_f32["logits_kv_f32_single"]).max()),
                    6,
                )
            }
            if kv_f32
            else {}
        ),
    }


def llama_cpp_system_info() -> str:
    import llama_cpp

    return str(llama_cpp.llama_print_system_info().decode().strip())


def model_facts(path: Path) -> dict[str, Any]:
    """What llama-bench names the model by: its one-line description
    (architecture, size class, file type), its bytes and parameters."""
    import ctypes

    import llama_cpp

    llm = llama(path, 256, 1)
    buf = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(llm._model.model, buf, len(buf))
    out = {
        "desc": buf.value.decode(),
        "size": int(llama_cpp.llama_model_size(llm._model.model)),
        "n_params": int(llama_cpp.llama_model_n_params(llm._model.model)),
    }
    del llm
    return out


def model_desc(path: Path) -> str:
    return str(model_facts(path)["desc"])


# general.file_type ids to name: llama.cpp's table ends before this.
MAX_FILE_TYPE = 48


def file_type_names(template: Path) -> dict[int, str]:
    """llama.cpp's name of every general.file_type id, read back from
    llama_model_desc on copies of ``template`` carrying each id (ids it
    does not know are left out)."""
    r = gguf.GGUFReader(str(template))
    out: dict[int, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "ftype.gguf"
        for ft in range(MAX_FILE_TYPE):
            w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
            for key, field in r.fields.items():
                if key.startswith("GGUF.") or key == "general.architecture":
                    continue
                kind = field.types[0]
                sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
                value = ft if key == "general.file_type" else field.contents()
                w.add_key_value(key, value, kind, sub_type=sub)
            for t in r.tensors:
                w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            # "llama ?B <file type>"
            name = model_desc(dst).split(" ", 2)[2]
            if name != "unknown, may not work":
                out[ft] = name
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"fixtures (default all): {', '.join(ALL_FIXTURES)}")
    ap.add_argument("--no-reference", action="store_true", help="only write the .gguf files")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in ALL_FIXTURES]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(ALL_FIXTURES)}")
    FIXTURE_DIR.mkdir(exist_ok=True)
    REF_DIR.mkdir(exist_ok=True)
    meta_path = REF_DIR / "meta.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    entries: dict[str, Any] = meta.get("fixtures", {})
    order = list(ALL_FIXTURES)
    for name in args.names or order:
        t0 = time.perf_counter()
        fx = ALL_FIXTURES[name]
        start, formats = write_fixture(fx, order.index(name) % len(FORMATS))
        path = fixture_path(name)
        entry: dict[str, Any] = {
            "arch": fx.arch,
            "features": fx.features,
            "file": f"fixtures/{path.name}",
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
            "format_cycle_start": None if start is None else FORMATS[start].name,
            "metadata": arch_metadata(path, fx.arch),
            "formats": formats,
        }
        if not args.no_reference:
            entry["references"] = [write_reference(fx, formats, i) for i in range(len(fx.n_ctx))]
            # The header below names the last run's build; a fixture made by
            # an earlier run keeps the name of its own.
            entry["llama_cpp_system_info"] = llama_cpp_system_info()
            entry["llama_cpp_model"] = model_facts(path)
        entries[name] = entry
        print(f"{name}: {entry['bytes']} bytes, {time.perf_counter() - t0:.2f} s", flush=True)
    if not args.no_reference:
        import llama_cpp

        first = fixture_path(next(iter(entries)))
        vocab_llm = llama_cpp.Llama(str(first), vocab_only=True, verbose=False)
        meta = {
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_version": llama_cpp.llama_version().decode(),
            "llama_cpp_system_info": llama_cpp_system_info(),
            "gguf": version("gguf"),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "settings": (
                f"n_threads={THREADS} seed={SEED}, default f16 KV cache (F32 for logits_f32), "
                "flash attention off, "
                "yarn_attn_factor/yarn_beta_fast/yarn_beta_slow -1 (from the file); "
                f"batched = one llama_decode of all {SEQ_LEN} tokens, single = one token per "
                "decode in a fresh context; greedy = argmax of the last logits, "
                f"{PROMPT_LEN}-token prompt then {GREEDY_LEN} tokens, one token per decode"
            ),
            "tokens": test_tokens(),
            "tokenize_check": {
                "text": "the quick brown fox",
                "ids": vocab_llm.tokenize(b"the quick brown fox", add_bos=True),
            },
            "fixtures": {k: entries[k] for k in order if k in entries},
        }
        del vocab_llm
        names = file_type_names(fixture_path(next(iter(TYPE_FIXTURES))))
        (REF_DIR / "file_types.json").write_text(json.dumps(names, indent=1) + "\n")
    else:
        meta["fixtures"] = {k: entries[k] for k in order if k in entries}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
