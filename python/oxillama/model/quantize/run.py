"""`quantize()`: a GGUF file in, a quantized GGUF file out, with the tensor
types, metadata and bytes llama-quantize writes for the same input and
options.

Everything that can refuse the job (an unknown type, a type we do not
write, a missing importance matrix, requantizing without leave) is checked
before the first byte is written; the output appears only when complete
(written beside it under a temporary name, then renamed)."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from oxillama import _native
from oxillama.errors import LoadError, ParameterError
from oxillama.model.quantize.ftypes import (
    FILE_TYPE_BY_ID,
    FILE_TYPE_BY_NAME,
    FILE_TYPES,
    GGML_TYPES,
    NEEDS_IMATRIX,
    TYPE_NAMES,
    FileType,
    is_quantized,
    row_bytes,
)
from oxillama.model.quantize.gguf_io import (
    I32,
    U16,
    U32,
    GgufLayout,
    TensorInfo,
    encode_kv,
    header_bytes,
    pad,
    read_layout,
)
from oxillama.model.quantize.imatrix import Imatrix, load_imatrix
from oxillama.model.quantize.rules import (
    Fallback,
    ModelFacts,
    Options,
    plan_types,
    tensor_order,
)

#: llama.cpp's `GGML_QNT_VERSION`, written as general.quantization_version.
QUANTIZATION_VERSION = 2
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")
#: Tensor types we write from floats without the Rust quantizers.
_FLOAT_OUT = ("F32", "F16", "BF16")


@dataclass
class TensorResult:
    name: str
    shape: tuple[int, ...]
    type_in: str
    type_out: str
    bytes_out: int


@dataclass
class QuantizeResult:
    """What `quantize` wrote."""

    outputs: list[Path]
    file_type: str
    tensors: list[TensorResult] = field(default_factory=list)
    #: Tensors whose rows were not whole blocks of the mix's type.
    fallbacks: list[Fallback] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0


def file_type(name: str | int) -> FileType:
    """The file type llama-quantize calls `name` (or numbers `name`)."""
    if isinstance(name, int) or str(name).isdigit():
        ft = FILE_TYPE_BY_ID.get(int(name))
    else:
        ft = FILE_TYPE_BY_NAME.get(str(name).upper())
    if ft is None:
        known = ", ".join(f.name for f in FILE_TYPES)
        raise ParameterError(f"unknown quantization type {name!r}; one of: {known}")
    return ft


def _tensor_type(name: str, what: str) -> str:
    t = name.upper()
    if t not in GGML_TYPES or t in ("Q8_1", "Q8_K"):
        raise ParameterError(f"unknown {what} {name!r}")
    return t


def writes_type(type_name: str) -> bool:
    """Whether we write tensors of `type_name`."""
    return type_name in _FLOAT_OUT or _native.can_quantize(GGML_TYPES[type_name])


@dataclass
class _Source:
    """One input tensor: where it lives (file index, layout)."""

    info: TensorInfo
    layout: GgufLayout
    file_index: int


def _open_inputs(path: Path) -> list[GgufLayout]:
    first = read_layout(path)
    count = int(first.values.get("split.count", 1))
    if count <= 1:
        return [first]
    m = _SPLIT_NAME.match(path.name)
    if m is None or int(m.group(2)) != 1:
        first.close()
        raise LoadError(f"{path}: a split model is opened by its first part (-00001-of-...)")
    layouts = [first]
    for i in range(2, count + 1):
        layouts.append(read_layout(path.with_name(f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf")))
    return layouts


def _to_f32(src: _Source) -> npt.NDArray[np.float32]:
    t = src.info
    n = t.n_elements
    raw = src.layout.tensor_bytes(t, row_bytes(t.type_id, t.shape[0]) * (n // t.shape[0]))
    if t.type_id == 0:
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if t.type_id == 1:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if t.type_id == 30:
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32)
    return _native.dequantize(t.type_id, bytes(raw), n)


def _from_f32(x: npt.NDArray[np.float32], type_name: str) -> bytes:
    """F32/F16/BF16 as ggml converts floats: round to nearest even (BF16's
    NaNs made quiet)."""
    if type_name == "F32":
        return x.astype("<f4").tobytes()
    if type_name == "F16":
        return x.astype("<f2").tobytes()
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    bits = np.where(nan, (u >> 16) | 64, rounded).astype("<u2")
    return bits.tobytes()


def _quantize_tensor(
    src: _Source, type_name: str, imatrix: npt.NDArray[np.float32] | None, threads: int | None
) -> bytes:
    x = _to_f32(src)
    if type_name in _FLOAT_OUT:
        return _from_f32(x, type_name)
    shape = src.info.shape
    ne0 = shape[0]
    ne1 = shape[1] if len(shape) > 1 else 1
    per_matrix = ne0 * ne1
    n_mat = x.size // per_matrix
    tid = GGML_TYPES[type_name]
    parts = []
    for i in range(n_mat):
        w = imatrix[i * ne0 : (i + 1) * ne0] if imatrix is not None else None
        parts.append(
            _native.quantize_rows(tid, x[i * per_matrix : (i + 1) * per_matrix], ne0, w, threads)
        )
    return b"".join(parts)


@contextmanager
def _atomic(path: Path) -> Iterator[IO[bytes]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, unit="B", unit_scale=True, desc="quantize", file=sys.stderr)


def quantize(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    type: str | int = "Q4_K_M",
    *,
    threads: int | None = None,
    imatrix: str | os.PathLike[str] | None = None,
    pure: bool = False,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    allow_requantize: bool = False,
    leave_output_tensor: bool = False,
    keep_split: bool = False,
    progress: bool = True,
) -> QuantizeResult:
    """Quantizes the GGUF model `input` into `output` as llama-quantize
    would with the same file `type` (e.g. "Q4_K_M", "Q8_0", "IQ4_XS",
    "MXFP4_MOE") and options: the same tensor types, metadata and bytes.

    `imatrix` is llama-imatrix's output (GGUF or the older .dat).
    `keep_split` writes one output per input part, named
    `OUTPUT-0000i-of-0000n.gguf` (OUTPUT without ".gguf"), also when the
    input is a single file. `threads` defaults to the physical cores.

    Raises ParameterError for a type we cannot write or an option that
    does not apply, LoadError for an unreadable input, both before any
    output is written.
    """
    ft = file_type(type)
    if threads is not None and threads < 1:
        raise ParameterError(f"threads must be at least 1, got {threads}")
    opts = Options(
        ftype=ft.name,
        output_tensor_type=_tensor_type(output_tensor_type, "--output-tensor-type")
        if output_tensor_type
        else None,
        token_embedding_type=_tensor_type(token_embedding_type, "--token-embedding-type")
        if token_embedding_type
        else None,
        pure=pure,
        quantize_output_tensor=not leave_output_tensor,
    )
    imat: Imatrix | None = load_imatrix(imatrix) if imatrix is not None else None
    opts.has_imatrix = imat is not None
    if imat is None and ft.name in ("IQ2_XS", "IQ2_XXS", "IQ2_S", "Q2_K_S", "IQ1_S", "IQ1_M"):
        raise ParameterError(
            f"{ft.name} needs an importance matrix (--imatrix FILE): without one the "
            "result is garbage, and llama-quantize refuses it too"
        )

    in_path = Path(input)
    out = Path(output)
    if out.exists() and in_path.exists() and out.samefile(in_path):
        raise ParameterError(f"the output {out} is the input; write to another file")
    layouts = _open_inputs(in_path)
    try:
        return _run(layouts, out, ft, opts, imat, threads, keep_split, progress, allow_requantize)
    finally:
        for lay in layouts:
            lay.close()


def _run(
    layouts: list[GgufLayout],
    out_path: Path,
    ft: FileType,
    opts: Options,
    imat: Imatrix | None,
    threads: int | None,
    keep_split: bool,
    show: bool,
    allow_requantize: bool,
) -> QuantizeResult:
    sources = {t.name: _Source(t, lay, i) for i, lay in enumerate(layouts) for t in lay.tensors}
    if keep_split:
        order = [
            s.info.name
            for s in sorted(sources.values(), key=lambda s: (s.file_index, s.info.offset))
        ]
    else:
        order = tensor_order(list(sources))
    facts = ModelFacts.from_metadata(layouts[0].values)
    plan = plan_types(
        [(n, sources[n].info.shape, sources[n].info.type_id) for n in order],
        facts,
        opts,
        ft.default,
    )

    # Everything that can refuse the job, before any work.
    for name in order:
        src = sources[name]
        cur = TYPE_NAMES.get(src.info.type_id)
        if cur is None:
            raise LoadError(f"tensor {name} has an unknown type id {src.info.type_id}")
        new = plan.types[name]
        if new == cur:
            continue
        needs = new in NEEDS_IMATRIX or (new == "Q2_K" and ft.name == "Q2_K_S")
        needs = needs and name not in (
            "token_embd.weight",
            "per_layer_token_embd.weight",
            "output.weight",
        )
        w = imat.get(name) if imat is not None else None
        want = src.info.shape[0] * (src.info.shape[2] if len(src.info.shape) > 2 else 1)
        if w is not None and w.size != want:
            if name not in ("token_embd.weight", "per_layer_token_embd.weight"):
                raise ParameterError(
                    f"the importance matrix of {name} has {w.size} values; the tensor needs {want}"
                )
        if needs and (w is None or w.size != want):
            raise ParameterError(
                f"{name} would be {new}, which needs an importance matrix (--imatrix FILE)"
                + ("" if imat is None else " holding this tensor")
            )
        if not writes_type(new):
            raise ParameterError(
                f"{name} would be {new}: oxillama does not write {new} tensors yet"
            )
        if is_quantized(src.info.type_id) and not allow_requantize:
            raise ParameterError(
                f"{name} is already {cur}: requantizing is refused unless --allow-requantize "
                "(quality suffers; quantize from the F16/BF16/F32 model when you can)"
            )

    # Outputs: one, or one per input part with --keep-split.
    n_split = len(layouts) if keep_split else 1
    if keep_split:
        stem = str(out_path)
        stem = stem[: -len(".gguf")] if stem.endswith(".gguf") else stem
        paths = [Path(f"{stem}-{i + 1:05d}-of-{n_split:05d}.gguf") for i in range(n_split)]
    else:
        paths = [out_path]
    base_kv = [
        (k, raw)
        for k, raw in layouts[0].raw_kv
        if k not in ("general.quantization_version", "general.file_type", *_SPLIT_KEYS)
    ]
    base_kv.append(
        (
            "general.quantization_version",
            encode_kv("general.quantization_version", U32, QUANTIZATION_VERSION),
        )
    )
    base_kv.append(("general.file_type", encode_kv("general.file_type", U32, ft.id)))
    alignment = layouts[0].alignment

    result = QuantizeResult(outputs=paths, file_type=ft.name, fallbacks=list(plan.fallbacks))
    parts: list[list[str]] = [[] for _ in range(n_split)]
    for name in order:
        parts[sources[name].file_index if keep_split else 0].append(name)

    def out_bytes(name: str) -> int:
        info = sources[name].info
        return row_bytes(GGML_TYPES[plan.types[name]], info.shape[0]) * (
            info.n_elements // info.shape[0]
        )

    total = sum(out_bytes(n) for n in order)
    bar = _progress(total, show)
    try:
        for i, (path, names) in enumerate(zip(paths, parts, strict=True)):
            kv = list(base_kv) if i == 0 else []
            if n_split > 1:
                kv += [
                    ("split.no", encode_kv("split.no", U16, i)),
                    ("split.count", encode_kv("split.count", U16, n_split)),
                    ("split.tensors.count", encode_kv("split.tensors.count", I32, len(order))),
                ]
            infos, offset = [], 0
            for name in names:
                info = sources[name].info
                infos.append((name, info.shape, GGML_TYPES[plan.types[name]], offset))
                offset += pad(out_bytes(name), alignment)
            with _atomic(path) as f:
                f.write(header_bytes(kv, infos, alignment))
                for name in names:
                    result.tensors.append(
                        _write_tensor(f, sources[name], plan.types[name], imat, threads, alignment)
                    )
                    result.bytes_in += _in_bytes(sources[name].info)
                    if bar is not None:
                        bar.update(out_bytes(name))
    finally:
        if bar is not None:
            bar.close()
    result.bytes_out = sum(t.bytes_out for t in result.tensors)
    return result


def _in_bytes(info: TensorInfo) -> int:
    return row_bytes(info.type_id, info.shape[0]) * (info.n_elements // info.shape[0])


def _write_tensor(
    f: IO[bytes],
    src: _Source,
    new: str,
    imat: Imatrix | None,
    threads: int | None,
    alignment: int,
) -> TensorResult:
    info = src.info
    cur = TYPE_NAMES[info.type_id]
    if new == cur:
        data: bytes | memoryview = src.layout.tensor_bytes(info, _in_bytes(info))
    else:
        w = imat.get(info.name) if imat is not None else None
        want = info.shape[0] * (info.shape[2] if len(info.shape) > 2 else 1)
        if w is not None and w.size != want:
            w = None  # token_embd: llama.cpp ignores a mismatched vector there
        data = _quantize_tensor(src, new, w, threads)
    n = memoryview(data).nbytes
    f.write(data)
    f.write(bytes(pad(n, alignment) - n))
    return TensorResult(info.name, info.shape, cur, new, n)
