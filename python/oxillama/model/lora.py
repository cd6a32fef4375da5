"""LoRA adapters: :class:`LoraAdapter` and the helpers that turn the
``lora=`` arguments of the public API into an active set.

An adapter is read once, checked against its base model (architecture,
target tensors, shapes; see ``rust/lora/``) and kept as a small side table;
the base weights are never changed, so any number of sessions can run the
same mapped model with different adapters, and switching costs nothing."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union

import oxillama._native as _native
from oxillama.errors import LoraError, ParameterError
from oxillama.model.model import Model

__all__ = ["LoraAdapter", "LoraSpec"]


class LoraAdapter:
    """One LoRA adapter file, loaded for one base :class:`~oxillama.Model`.

    ``name`` (the file's stem unless given), ``path``, ``alpha``
    (``adapter.lora.alpha``; 0 means scales apply as given), ``rank`` (the
    largest rank; ``ranks`` per target), ``targets`` (base tensor names) and
    ``fingerprint`` (BLAKE3 of the file, hex) describe it. The effective
    scale of a pair is ``scale * alpha / rank``, or ``scale`` when alpha is
    0, as in llama.cpp."""

    def __init__(
        self, model: Model, path: str | os.PathLike[str], *, name: str | None = None
    ) -> None:
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise LoraError(f"cannot read LoRA adapter {str(p)!r}: {e}") from e
        try:
            gguf = _native.GgufFile.from_bytes(data)
        except LoraError:
            raise
        except Exception as e:  # a LoadError from the GGUF reader
            raise LoraError(f"LoRA adapter {str(p)!r} is not a valid GGUF file: {e}") from e
        try:
            native = _native.LoraAdapter(model.native, gguf)
        except LoraError as e:
            raise LoraError(f"LoRA adapter {str(p)!r}: {e}") from None
        self.model = model
        self.path = p.resolve()
        self.name = name if name is not None else p.stem
        self.native = native
        self.alpha = float(native.alpha)
        self.ranks: dict[str, int] = dict(native.ranks())
        self.targets: tuple[str, ...] = tuple(self.ranks)
        self.rank = max(self.ranks.values())
        self.fingerprint: str = _native.blake3(data).hex()
        self.nbytes = int(native.nbytes)

    def __repr__(self) -> str:
        return (
            f"LoraAdapter({self.name!r}, rank={self.rank}, alpha={self.alpha:g}, "
            f"targets={len(self.targets)}, path={str(self.path)!r})"
        )


#: What ``lora=`` accepts: an adapter or a path (scale 1), an
#: ``(adapter or path, scale)`` pair, a list of those, or a mapping from
#: adapters or paths to scales.
LoraSpec = Union[
    LoraAdapter,
    str,
    "os.PathLike[str]",
    tuple[Any, float],
    Iterable[Any],
    Mapping[Any, float],
]


def _scale(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(f"{what}: a LoRA scale must be a number, got {value!r}")
    s = float(value)
    if s != s or s in (float("inf"), float("-inf")):
        raise ParameterError(f"{what}: a LoRA scale must be finite, got {value!r}")
    return s


def resolve(
    model: Model,
    spec: Any,
    load: Any,
) -> dict[LoraAdapter, float]:
    """``spec`` as an ordered ``{adapter: scale}``; ``load(path)`` turns a
    path into an adapter (so an engine reuses what it already loaded)."""

    def one(item: Any) -> LoraAdapter:
        if isinstance(item, LoraAdapter):
            if item.model is not model:
                raise LoraError(
                    f"LoRA adapter {item.name!r} was loaded for another model "
                    f"({item.model.model_path}), not {model.model_path}"
                )
            return item
        if isinstance(item, (str, os.PathLike)):
            adapter: LoraAdapter = load(item)
            return adapter
        raise ParameterError(f"lora: expected an adapter or a path, got {item!r}")

    out: dict[LoraAdapter, float] = {}
    if spec is None:
        return out
    if isinstance(spec, Mapping):
        for k, v in spec.items():
            out[one(k)] = _scale(v, "lora")
        return out
    if isinstance(spec, (LoraAdapter, str, os.PathLike)):
        return {one(spec): 1.0}
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], (tuple, list)):
        if isinstance(spec[1], (int, float)) and not isinstance(spec[1], bool):
            return {one(spec[0]): _scale(spec[1], "lora")}
    if isinstance(spec, Iterable):
        for item in spec:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise ParameterError(f"lora: expected (adapter or path, scale), got {item!r}")
                out[one(item[0])] = _scale(item[1], "lora")
            else:
                out[one(item)] = 1.0
        return out
    raise ParameterError(f"lora: unsupported value {spec!r}")


def apply(kv: _native.Session, active: Mapping[LoraAdapter, float]) -> None:
    """Makes ``active`` the native session's adapters (in order); one at
    scale 0 adds nothing and is not computed (llama.cpp drops those too)."""
    kv.set_loras([(a.native, float(s)) for a, s in active.items() if s != 0.0])
