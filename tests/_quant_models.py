"""Float models for the quantizer tests, made from the committed fixtures:
every tensor dequantized by gguf-py (llama.cpp's own Python reference),
layers repeated (scaled) to reach a depth where the mixes' layer rules
differ, and written as F16 (or F32) with our GGUF writer."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
from gguf.quants import dequantize as ref_dequantize

from oxillama.model.quantize.gguf_io import U32, encode_kv, header_bytes, pad, read_layout

FIXTURES = Path(__file__).parent / "models" / "fixtures"
F32_ID, F16_ID = 0, 1


def float_model(fixture: str, out: Path, *, n_layers: int, dtype: str = "f16") -> Path:
    src = read_layout(FIXTURES / f"{fixture}.gguf")
    arch = src.values["general.architecture"]
    n_src = int(src.values[f"{arch}.block_count"])
    blk = re.compile(r"^blk\.(\d+)\.(.*)$")

    def values(name: str, info_shape: tuple[int, ...], type_id: int, offset: int) -> np.ndarray:
        t = next(t for t in src.tensors if t.name == name)
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        qt = GGMLQuantizationType(t.type_id)
        bs, ts = GGML_QUANT_SIZES[qt]
        raw = np.frombuffer(src.tensor_bytes(t, t.n_elements // bs * ts), dtype=np.uint8)
        return np.asarray(ref_dequantize(raw, qt), dtype=np.float32).reshape(-1)

    order: list[tuple[str, np.ndarray, tuple[int, ...]]] = []
    for t in src.tensors:
        m = blk.match(t.name)
        if m and int(m.group(1)) != 0:
            continue
        if not m:
            order.append((t.name, values(t.name, t.shape, t.type_id, t.offset), t.shape))
            continue
        for i in range(n_layers):
            name = f"blk.{i % n_src}.{m.group(2)}"
            base = next(s for s in src.tensors if s.name == name)
            v = values(name, base.shape, base.type_id, base.offset)
            if i >= n_src:
                v = v * np.float32(1.0 + 0.0625 * i)
            order.append((f"blk.{i}.{m.group(2)}", v, base.shape))
    # Tensors in the file order a converter writes: embeddings, layers, head.
    head = [o for o in order if not o[0].startswith("blk.") and not o[0].startswith("output")]
    layers = sorted(
        (o for o in order if o[0].startswith("blk.")), key=lambda o: int(o[0].split(".")[1])
    )
    tail = [o for o in order if o[0].startswith("output")]
    tensors = head + layers + tail

    raw_kv = []
    for key, raw in src.raw_kv:
        if key == f"{arch}.block_count":
            raw = encode_kv(key, U32, n_layers)
        raw_kv.append((key, raw))
    datas, infos, offset = [], [], 0
    for name, v, shape in tensors:
        tid = F32_ID if len(shape) == 1 or dtype == "f32" else F16_ID
        data = v.astype(np.float32 if tid == F32_ID else np.float16).tobytes()
        infos.append((name, shape, tid, offset))
        datas.append(data)
        offset += pad(len(data), 32)
    with open(out, "wb") as f:
        f.write(header_bytes(raw_kv, infos, 32))
        for d in datas:
            f.write(d)
            f.write(bytes(pad(len(d), 32) - len(d)))
    src.close()
    return out


__all__ = ["float_model", "struct"]
