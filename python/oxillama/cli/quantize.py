"""``oxillama quantize``: llama-quantize's command, from our quantizers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from oxillama.errors import ParameterError

DESCRIPTION = """\
Quantize a GGUF model: IN is the model in F32, F16 or BF16 (or already
quantized, with --allow-requantize), TYPE a llama.cpp file type. The
output has the tensor types, metadata and bytes llama-quantize writes for
the same input and options, so a model quantized here or there is the
same file.

Each file type is a mix: most tensors get its base type, and llama.cpp's
rules give some more bits (the output and token embeddings, attn_v and
ffn_down in chosen layers for the _M mixes, ...). 1-D tensors (norms,
biases) stay F32, and a tensor whose rows are not whole blocks of its type
falls back to one whose blocks fit (Q4_K to Q5_0, Q6_K to Q8_0, IQ4_XS to
IQ4_NL...), as llama.cpp does. --pure gives every tensor the base type.

The output is written under a temporary name beside OUT and renamed when
complete; a type that cannot be written is refused before any work."""


def _types_table() -> str:
    from oxillama.model.quantize.ftypes import FILE_TYPES, bits_per_weight
    from oxillama.model.quantize.run import writes_type

    lines = ["file types (TYPE), with their base tensor type's bits per weight:"]
    for ft in FILE_TYPES:
        note = "" if writes_type(ft.default) else " (not written by oxillama yet)"
        bpw = bits_per_weight(ft.default)
        lines.append(f"  {ft.name:<10} {ft.default:<7} {bpw:5.2f}  {ft.about}{note}")
    return "\n".join(lines)


EPILOG = """\
examples:
  oxillama quantize model-f16.gguf model-Q4_K_M.gguf Q4_K_M
  oxillama quantize model-f16.gguf model-Q4_K_M.gguf Q4_K_M 8       8 threads
  oxillama quantize --imatrix imatrix.gguf model-f16.gguf out.gguf IQ4_XS
  oxillama quantize --pure model-f16.gguf out.gguf Q8_0              every tensor Q8_0
  oxillama quantize --output-tensor-type Q8_0 model-f16.gguf out.gguf Q4_K_M
  oxillama quantize model-f16.gguf Q6_K          writes ggml-model-Q6_K.gguf beside IN

Which to choose: Q4_K_M is the usual 4-bit choice; Q5_K_M and Q6_K trade
size for quality, Q8_0 is near lossless; IQ4_XS is smaller than Q4_K_S at
about its quality, better still with --imatrix; IQ3_M and IQ3_S go below
4 bits; IQ3_XXS and the IQ2 and IQ1 mixes need --imatrix (for 2 bits and
less, an importance matrix from text like the model's use is what keeps it
usable); MXFP4_MOE is for MoE models (experts in MXFP4, other tensors Q8_0).

"""


def add_parser(sub: Any) -> None:
    q = sub.add_parser(
        "quantize",
        help="quantize a GGUF model as llama-quantize does (same types and bytes)",
        description=DESCRIPTION,
        epilog=EPILOG + _types_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument(
        "args",
        nargs="+",
        metavar="IN [OUT] TYPE [NTHREADS]",
        help="input GGUF, output GGUF (default: ggml-model-TYPE.gguf beside IN), "
        "file type, and threads (default: the physical cores)",
    )
    q.add_argument(
        "--imatrix",
        metavar="FILE",
        help="importance matrix from llama-imatrix (GGUF or the older .dat): steers the "
        "K-quants, legacy quants and i-quants toward the weights that matter; the "
        "IQ3_XXS, IQ2 and IQ1 mixes and Q2_K_S need one",
    )
    q.add_argument(
        "--allow-requantize",
        action="store_true",
        help="accept tensors that are already quantized (they are dequantized first; "
        "quality suffers, quantize from F16/BF16/F32 when you can)",
    )
    q.add_argument(
        "--leave-output-tensor",
        action="store_true",
        help="keep output.weight as it is in IN (bigger file, a little better quality)",
    )
    q.add_argument(
        "--pure",
        action="store_true",
        help="every quantizable tensor gets TYPE's base type: no mix, no k-quant upgrades",
    )
    q.add_argument(
        "--output-tensor-type",
        metavar="TYPE",
        help="tensor type of output.weight (e.g. Q8_0, F16)",
    )
    q.add_argument(
        "--token-embedding-type",
        metavar="TYPE",
        help="tensor type of token_embd.weight",
    )
    q.add_argument(
        "--keep-split",
        action="store_true",
        help="write one output per part of a split IN, named OUT-0000i-of-0000n.gguf (OUT "
        "without .gguf); for a single-file IN that is one file, OUT-00001-of-00001.gguf, "
        "as llama-quantize does",
    )
    q.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    q.set_defaults(func=cmd_quantize)


def _positionals(args: list[str]) -> tuple[Path, Path | None, str, int | None]:
    """llama-quantize's positional form: IN [OUT] TYPE [NTHREADS]."""
    from oxillama.model.quantize import file_type

    def is_type(s: str) -> bool:
        try:
            file_type(s)
            return True
        except ParameterError:
            return False

    if len(args) < 2 or len(args) > 4:
        raise ParameterError("expected IN [OUT] TYPE [NTHREADS]")
    src, rest = Path(args[0]), args[1:]
    out: Path | None = None
    if not is_type(rest[0]):
        out, rest = Path(rest[0]), rest[1:]
    if not rest:
        raise ParameterError("missing TYPE (e.g. Q4_K_M); `oxillama quantize -h` lists them")
    ftype = rest[0]
    file_type(ftype)  # an unknown type is named here, with the list
    threads = None
    if len(rest) > 2:
        raise ParameterError(f"unexpected argument {rest[2]!r} after NTHREADS")
    if len(rest) == 2:
        if not rest[1].isdigit() or int(rest[1]) < 1:
            raise ParameterError(f"NTHREADS must be a positive integer, got {rest[1]!r}")
        threads = int(rest[1])
    return src, out, ftype, threads


def cmd_quantize(args: argparse.Namespace) -> int:
    from oxillama.model.quantize import file_type, quantize

    src, out, ftype, threads = _positionals(args.args)
    if out is None:
        suffix = "" if args.keep_split else ".gguf"
        out = src.parent / f"ggml-model-{file_type(ftype).name}{suffix}"
    result = quantize(
        src,
        out,
        ftype,
        threads=threads,
        imatrix=args.imatrix,
        pure=args.pure,
        output_tensor_type=args.output_tensor_type,
        token_embedding_type=args.token_embedding_type,
        allow_requantize=args.allow_requantize,
        leave_output_tensor=args.leave_output_tensor,
        keep_split=args.keep_split,
        progress=not args.quiet,
    )
    if not args.quiet:
        groups: dict[tuple[str, str, int], int] = {}
        for fb in result.fallbacks:
            key = (fb.wanted, fb.used, fb.columns)
            groups[key] = groups.get(key, 0) + 1
        for (wanted, used, cols), n in groups.items():
            print(
                f"oxillama: note: {n} tensor(s) of {cols} columns are not whole {wanted} "
                f"blocks: {used} instead, as llama.cpp does",
                file=sys.stderr,
            )
        counts: dict[str, int] = {}
        for t in result.tensors:
            counts[t.type_out] = counts.get(t.type_out, 0) + 1
        mix = ", ".join(f"{n} {ty}" for ty, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        mib = 1024 * 1024
        print(
            f"{result.file_type}: {len(result.tensors)} tensors ({mix}), "
            f"{result.bytes_in / mib:.2f} MiB -> {result.bytes_out / mib:.2f} MiB",
            file=sys.stderr,
        )
        for p in result.outputs:
            print(p)
    return 0
