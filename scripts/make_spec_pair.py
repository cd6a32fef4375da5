"""Writes the speculative-decoding model pair from SmolLM2 with the `gguf`
package: the target is every tensor dequantized to F16 (norms stay F32),
the draft is the same weights requantized to Q4_0. Same tokenizer, same
metadata.

    python scripts/make_spec_pair.py [OUT_DIR]   # default ~/.cache/oxillama/spec

Prints the two paths. Idempotent: existing files are kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def _copy_metadata(reader: object, writer: object) -> None:
    import gguf

    for field in reader.fields.values():  # type: ignore[attr-defined]
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])  # type: ignore[attr-defined]
        else:
            writer.add_key_value(name, value, vtype)  # type: ignore[attr-defined]


def write(src: Path, dst: Path, kind: str) -> None:
    import gguf
    from gguf import quants

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    _copy_metadata(r, w)
    target = {"f16": gguf.GGMLQuantizationType.F16, "q4_0": gguf.GGMLQuantizationType.Q4_0}[kind]
    for t in r.tensors:
        x = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape.tolist())]  # numpy order
        x = x.reshape(shape)
        if x.ndim == 1 or x.shape[-1] % 32:
            w.add_tensor(t.name, x, raw_dtype=gguf.GGMLQuantizationType.F32)
        elif target == gguf.GGMLQuantizationType.F16:
            w.add_tensor(t.name, x.astype(np.float16), raw_dtype=target)
        else:
            q = quants.quantize(x, target)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=target)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_pair(out: Path) -> tuple[Path, Path]:
    from oxillama.model.paths import default_model_path

    src = Path(default_model_path())
    out.mkdir(parents=True, exist_ok=True)
    target, draft = out / "smollm2-135m-f16.gguf", out / "smollm2-135m-q4_0.gguf"
    for path, kind in ((target, "f16"), (draft, "q4_0")):
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            write(src, tmp, kind)
            tmp.replace(path)
    return target, draft


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache/oxillama/spec"
    for p in make_pair(out):
        print(p)
