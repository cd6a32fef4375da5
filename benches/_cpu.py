"""The CPU a benchmark ran on, for its header: the CPU under a session
changes (AVX2-only AMD, or Intel with AVX-512 and AMX), so figures only
compare within one run and each run says where it was taken."""

from __future__ import annotations

import os
import platform

#: The SIMD features the kernels choose between at run time.
FLAGS = (
    "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_vbmi avx512_bf16 "
    "avx512_fp16 avx_vnni amx_tile amx_int8 amx_bf16"
).split()


def describe() -> str:
    """``model, N logical CPUs; flags: ...``."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and not flags:
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
                    break
    except OSError:
        pass
    shown = " ".join(f for f in FLAGS if f in flags)
    return f"{model}, {os.cpu_count()} logical CPUs; flags: {shown}"
