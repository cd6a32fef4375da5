"""Records llama.cpp's quantizer outputs for tests/test_quantize_file.py
and tests/test_quantize_rows.py.

Rows: ggml's `ggml_quantize_chunk` (libggml-base, as llama-quantize calls
it) on the rows of tests/_quant_rows.py for every type we write, with and
without an importance vector; tests/reference/quantize_rows.json keeps the
hash of each output.

For every case of tests/_quant_cases.py it builds the input model, runs
`llama_model_quantize` (llama-cpp-python's binding of llama-quantize's
library call) with the same file type and options, and stores the hash of
the whole file and of each tensor's bytes, with each tensor's type, in
tests/reference/quantize_refs.json. CI has no llama.cpp; the test compares
against this file.

An importance matrix is read by our loader and handed to llama.cpp as its
`imatrix` parameter (llama-quantize's own file parser is not in the
library), so the cases with one test the quantizers under it, and the
parsers are tested on their own.

Usage: python scripts/make_quantize_refs.py
"""

from __future__ import annotations

import ctypes
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

from oxillama.model.quantize.ftypes import FILE_TYPE_BY_NAME, GGML_TYPES  # noqa: E402
from oxillama.model.quantize.imatrix import load_imatrix  # noqa: E402
from tests._quant_cases import (  # noqa: E402
    CASES,
    REFS,
    build_input,
    file_digest,
    tensor_digests,
    write_imatrix,
)
from tests._quant_rows import N_PER_ROW, importance, rows  # noqa: E402

ROW_TYPES = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0",
    "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M",
]  # fmt: skip
# ggml aborts on these without an importance vector.
NEEDS_WEIGHTS = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
ROW_REFS = ROOT / "tests" / "reference" / "quantize_rows.json"


def ggml_rows() -> None:
    import hashlib
    import os

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    x = rows()
    w = importance()
    out = {}
    for name in ROW_TYPES:
        t = GGML_TYPES[name]
        lib.ggml_quantize_init(t)
        for label, qw in (("plain", None), ("imatrix", w)):
            if qw is None and name in NEEDS_WEIGHTS:
                continue
            buf = ctypes.create_string_buffer(lib.ggml_row_size(t, N_PER_ROW) * x.shape[0])
            lib.ggml_quantize_chunk(
                t, x.ctypes.data, buf, 0, x.shape[0], N_PER_ROW,
                None if qw is None else qw.ctypes.data,
            )  # fmt: skip
            out[f"{name}/{label}"] = hashlib.sha256(buf.raw).hexdigest()
    ROW_REFS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {ROW_REFS}")


def llama_quantize(src: Path, dst: Path, case: dict[str, Any], imatrix: Path | None) -> None:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = FILE_TYPE_BY_NAME[case["ftype"]].id
    p.nthread = 2
    opts = case.get("options", {})
    p.pure = bool(opts.get("pure", False))
    p.allow_requantize = bool(opts.get("allow_requantize", False))
    p.quantize_output_tensor = not opts.get("leave_output_tensor", False)
    p.keep_split = bool(opts.get("keep_split", False))
    if "output_tensor_type" in opts:
        p.output_tensor_type = GGML_TYPES[opts["output_tensor_type"]]
    if "token_embedding_type" in opts:
        p.token_embedding_type = GGML_TYPES[opts["token_embedding_type"]]
    keep: list[Any] = []
    if imatrix is not None:
        data = load_imatrix(imatrix)
        arr = (llama_cpp.llama_model_imatrix_data * (len(data) + 1))()
        for i, (name, v) in enumerate(data.items()):
            buf = (ctypes.c_float * v.size)(*v.tolist())
            keep.append(buf)
            arr[i].name = name.encode()
            arr[i].data = ctypes.cast(buf, ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        arr[len(data)].name = None
        p.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(arr)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    if rc != 0:
        raise SystemExit(f"{case['id']}: llama_model_quantize failed ({rc})")


def main() -> None:
    ggml_rows()
    out: dict[str, Any] = {"llama_cpp_python": llama_cpp.__version__, "cases": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for case in CASES:
            src = build_input(case["input"], tmp)
            imatrix = None
            if case.get("imatrix"):
                imatrix = write_imatrix(case["imatrix"], src, tmp / f"{case['id']}.imatrix")
            dst = tmp / f"{case['id']}.gguf"
            llama_quantize(src, dst, case, imatrix)
            if case.get("options", {}).get("keep_split"):
                dst = Path(f"{dst}-00001-of-00001.gguf")  # llama.cpp keeps ".gguf" in
            out["cases"].append(
                {
                    "id": case["id"],
                    "file_sha256": file_digest(dst),
                    "tensors": tensor_digests(dst),
                }
            )
            print(case["id"], out["cases"][-1]["file_sha256"][:16], flush=True)
    # One tensor a line: the file stays readable in a diff.
    lines = [json.dumps({k: v for k, v in out.items() if k != "cases"})[:-1] + ', "cases": [']
    for i, case in enumerate(out["cases"]):
        head = {k: v for k, v in case.items() if k != "tensors"}
        lines.append(" " + json.dumps(head)[:-1] + ', "tensors": [')
        lines += [
            "  " + json.dumps(t) + ("," if j < len(case["tensors"]) - 1 else "")
            for j, t in enumerate(case["tensors"])
        ]
        lines.append(" ]}" + ("," if i < len(out["cases"]) - 1 else ""))
    lines.append("]}")
    REFS.write_text("\n".join(lines) + "\n")
    print(f"wrote {REFS}")


if __name__ == "__main__":
    main()
