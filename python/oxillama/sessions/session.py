"""Freezing a :class:`~oxillama.SessionState` into OXISNAP1 and back.

This module knows the session's state, never the engines that hold it:
:class:`~oxillama.Engine` and :class:`~oxillama.AsyncSession` hand it a
state to write and build themselves on the state it reads."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import oxillama._native as _native
from oxillama._native import GrammarMatcher, __version__
from oxillama.decoding.grammar import Grammar
from oxillama.decoding.sampling import SamplerConfig, build_sampler
from oxillama.engine.kv_types import kv_position_bytes, kv_types
from oxillama.engine.session_state import ContextShift, SessionState
from oxillama.errors import (
    AdapterMismatchError,
    ModelMismatchError,
    OxiLlamaError,
    ParameterError,
    SnapshotError,
    SnapshotFormatError,
)
from oxillama.model.fingerprint import Fingerprint, prefetch_fingerprint
from oxillama.model.hub import HubRef
from oxillama.model.hub import locate as hub_locate
from oxillama.model.lora import LoraAdapter
from oxillama.model.lora import apply as apply_loras
from oxillama.model.model import Model
from oxillama.model.offload import policy_from_dict
from oxillama.sessions import sections as S
from oxillama.sessions.atomic import replace_file
from oxillama.sessions.format import (
    HEADER,
    VERSION,
    Writer,
    decode_verifying,
    encode_into,
    encoded_size,
    fill_payload,
    seal,
)
from oxillama.sessions.state_slots import compact_every_layer_state

#: What ``meta.engine.offload`` holds for a model without a memory policy
#: (every snapshot before the pager; still read and written that way).
OFFLOAD_NONE = "cpu"

#: Builds the native session a restored state lives in: (model, context
#: size, threads, kv dtype). The default is a private one; the batching
#: scheduler passes one that draws pages from its shared pool.
MakeKv = Callable[[Model, int, int | None, str], _native.Session]


def capture_bytes(state: SessionState) -> bytes:
    """The session as one OXISNAP1 blob (weights excluded), an immutable
    ``bytes`` written in place (one allocation, one pass; see
    ``_native.filled_bytes``)."""
    secs = writers(state)
    return _native.filled_bytes(encoded_size(secs), lambda view: encode_into(secs, view))


def capture_into(state: SessionState, buffer: Any) -> int:
    """Writes the session into the start of a writable buffer, as
    ``llama_state_get_data`` does; returns the bytes written."""
    secs = writers(state)
    n = encoded_size(secs)
    try:
        view = memoryview(buffer)
    except TypeError:
        raise ParameterError(
            f"snapshot_into needs a writable buffer, not {type(buffer).__name__}"
        ) from None
    with view:
        if view.readonly or not view.c_contiguous:
            raise ParameterError("snapshot_into needs a writable, contiguous buffer")
        with view.cast("B") as flat, flat[:n] as out:
            if out.nbytes < n:
                raise ParameterError(f"the snapshot needs {n} bytes, the buffer has {flat.nbytes}")
            encode_into(secs, out)
    return n


def snapshot_size(state: SessionState) -> int:
    """Bytes :func:`capture_into` writes for the session as it is now."""
    return encoded_size(writers(state))


def _kv_rot(state: SessionState) -> tuple[int, int]:
    """The Hadamard block sizes the session's cached keys and values are
    stored under (0: none; a recurrent model caches no rows)."""
    if _state_only(state.model.config):
        return (0, 0)
    k, v = state.kv.kv_rot
    return (int(k), int(v))


def writers(state: SessionState) -> list[Writer]:
    """The session as OXISNAP1 sections, each written in place by
    :func:`~oxillama.sessions.format.encode_into`."""
    model = state.model
    if model.model_path is None:
        raise SnapshotError(
            "this engine was loaded from bytes: a snapshot references its model by "
            "path, so open the model from a file to snapshot it"
        )
    cfg = model.config
    kv = state.kv
    rot = _kv_rot(state)
    meta: dict[str, Any] = {
        "arch": model.arch,
        "model_path": str(model.model_path),
        "tokenizer_path": None if model.tokenizer_path is None else str(model.tokenizer_path),
        "fingerprint": model.fingerprint().to_dict(),
        **({"hub": model.hub.to_dict()} if model.hub is not None else {}),
        "vocab_size": model.vocab_size,
        "n_past": state.n_past,
        "kv_layout": _kv_layout(cfg),
        "engine": {
            "context_size": kv.n_ctx,
            "threads": kv.threads,
            "prefill_chunk": kv.prefill_chunk,
            "kv_dtype": kv.kv_dtype,
            # Only when rotated, so other snapshots read as before.
            **({"kv_rot": dict(zip(("k", "v"), rot, strict=True))} if any(rot) else {}),
            "offload": OFFLOAD_NONE if model.offload is None else model.offload.to_dict(),
            # Only when on, so snapshots without it read as before.
            **(
                {"context_shift": {"n_keep": state.context_shift.n_keep}}
                if state.context_shift is not None
                else {}
            ),
        },
        **({"context_shifts": state.shifts} if state.shifts else {}),
        # Fixed width (isoformat drops a zero microsecond), so the size a
        # snapshot_size() call reports is the size the next save writes.
        "created_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00"),
        "library_version": __version__,
    }
    small: list[tuple[int, bytes]] = [
        (S.META, S.encode_json(meta)),
        (S.TOKENS, S.encode_u32(state.tokens)),
        (S.SAMPLER_CONFIG, S.encode_json(state.sampler_config.to_dict())),
        (S.SAMPLER_STATE, S.encode_sampler_state(state.sampler.get_state())),
    ]
    last = _last_position(state)
    if last is not None:
        small.append(last)
    if state.loras:
        adapters = [
            {"name": a.name, "path": str(a.path), "fingerprint": a.fingerprint, "scale": s}
            for a, s in state.loras.items()
        ]
        small.append((S.LORA, S.encode_json({"adapters": adapters})))
    if state.grammar is not None:
        grammar, matcher = state.grammar
        g = {"source": grammar.source, "root": grammar.root, "state": matcher.export_state()}
        small.append((S.GRAMMAR, S.encode_json(g)))
    out: list[Writer] = [(tag, len(data), _copier(data)) for tag, data in small]
    # The KV cache goes straight from the session into the file image.
    out.insert(2, (S.KV, state.kv_len(), state.export_kv_into))
    return out


def _last_position(state: SessionState) -> tuple[int, bytes] | None:
    """The hidden state when the output head turns it back into exactly
    the next-token logits, else the logits themselves. A state parked as
    its hidden state, or just after a plain ``eval``, holds that by
    construction; otherwise it is checked here, bit for bit, by recomputing
    the head (2.5 ms on SmolLM2)."""
    if state.hidden is not None:
        return S.HIDDEN, S.encode_f32(state.hidden)
    logits = state.logits
    if logits is None:
        return None
    kv = state.kv
    if state.swapped is not None:
        return S.LOGITS, S.encode_f32(logits)
    hidden = kv.last_hidden()
    if hidden is not None and kv.logits_from_head:
        return S.HIDDEN, S.encode_f32(hidden)
    if hidden is not None:
        again = kv.head_logits(hidden)
        if again.shape == logits.shape and again.tobytes() == logits.tobytes():
            return S.HIDDEN, S.encode_f32(hidden)
    return S.LOGITS, S.encode_f32(logits)


def _copier(data: bytes) -> Callable[[memoryview], None]:
    def fill(view: memoryview) -> None:
        view[:] = data

    return fill


def parse(blob: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[int, memoryview]]:
    """Verifies a blob; returns its META object and all sections."""
    meta, secs, verified = parse_verifying(blob, background=False)
    verified()
    return meta, secs


def parse_verifying(
    blob: bytes | bytearray | memoryview, *, background: bool = True
) -> tuple[dict[str, Any], dict[int, memoryview], Callable[[], None]]:
    """:func:`parse` with the checksum left running (see
    :func:`~.format.decode_verifying`): ``verified()`` must be called before
    anything is changed by the sections or an error in them is raised."""
    _, secs, verified = decode_verifying(blob, background=background)
    try:
        missing = [S.NAMES[t] for t in S.REQUIRED if t not in secs]
        if missing:
            raise SnapshotFormatError(f"missing required section(s): {', '.join(missing)}")
        meta = S.decode_json(secs[S.META], "meta")
        for key in ("arch", "model_path", "fingerprint", "vocab_size", "n_past", "engine"):
            if key not in meta:
                raise SnapshotFormatError(f"meta section lacks {key!r}")
    except BaseException:
        verified()  # a corrupt file reports its checksum, not what it broke
        raise
    return meta, secs, verified


def _int(d: dict[str, Any], key: str, what: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SnapshotFormatError(f"{what}.{key} must be a non-negative integer, got {v!r}")
    return v


def _private_kv(model: Model, n_ctx: int, threads: int | None, kv_dtype: str) -> _native.Session:
    return _native.Session(model.native, n_ctx, threads, kv_dtype)


def _no_wait() -> None:
    pass


def _model_for(
    meta: dict[str, Any],
    model: Model | None,
    model_path: str | os.PathLike[str] | None,
    verified: Callable[[], None] = lambda: None,
) -> Model:
    """The model the snapshot names, checked against its fingerprint: the
    one given, else the process's copy of the file (loaded if it has none).
    ``verified`` waits for the snapshot's checksum, which may run while the
    model loads; nothing is changed before it returns."""
    expected = Fingerprint.from_dict(meta["fingerprint"])
    hub = HubRef.from_dict(meta.get("hub"))
    if model is None:
        path = Path(model_path) if model_path is not None else Path(str(meta["model_path"]))
        if not path.is_file() and model_path is None and hub is not None:
            # Another machine: the same commit's file through its hub cache
            # (downloaded if allowed); the fingerprint below still decides.
            path = hub_locate(hub)
        if not path.is_file():
            raise SnapshotError(
                f"model file {str(path)!r} not found; pass model_path= to point at its new place"
            )
        tok_path = meta.get("tokenizer_path")
        fingerprinted = prefetch_fingerprint(path, expected.probe)
        try:
            model = Model(path, tokenizer_path=tok_path if isinstance(tok_path, str) else None)
        except OxiLlamaError as e:
            raise SnapshotError(f"cannot load the model for this snapshot: {e}") from e
        finally:
            fingerprinted()
        verified()
        if model.hub is None and hub is not None and model.model_path == path:
            model.hub = hub
    verified()
    if model.model_path is None:
        raise SnapshotError("a model loaded from bytes cannot be checked against a snapshot")
    found = model.fingerprint(expected.probe)
    if not expected.matches(found):
        raise ModelMismatchError(
            f"{model.model_path} is not the model this snapshot was taken with: "
            f"expected {expected}, found {found}",
            expected=expected,
            found=found,
        )
    vocab = _int(meta, "vocab_size", "meta")
    if model.arch != meta["arch"] or model.vocab_size != vocab:
        raise ModelMismatchError(
            f"snapshot is for a {meta['arch']} model with {vocab} tokens, "
            f"{model.model_path} holds a {model.arch} model with {model.vocab_size}",
            expected=(meta["arch"], vocab),
            found=(model.arch, model.vocab_size),
        )
    return model


def restore(
    blob: bytes | bytearray | memoryview,
    *,
    model: Model | None = None,
    model_path: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    make_kv: MakeKv = _private_kv,
    context_size: int | None = None,
    defer_kv: bool = False,
    kv_dtype: str | None = None,
) -> SessionState:
    """The session in ``blob``, on ``model`` or on the model it names.

    The KV cache keeps the snapshot's types unless ``kv_dtype`` names
    others, or ``make_kv`` gives a session of others (a scheduler's shared
    pool): the snapshot's KV is then converted once, row by row, which
    warns unless ``kv_dtype`` asked for it.

    In a process that already holds the model this verifies the checksum,
    compares fingerprints (cached) and imports the KV: nothing else. The
    next-token logits stay a hidden state until first needed.

    ``defer_kv`` leaves the KV hibernated (checked and copied, not
    imported): the batching scheduler imports it when pages are free."""
    # A fresh process loads the model while the checksum runs (both long,
    # and the hash needs no GIL); until verified() nothing is changed by
    # the file's contents, and an error in them defers to the checksum.
    # Into a new private session (a restore in a process that holds the
    # model) the checksum also runs beside the parsing below: nothing
    # outside this call sees the new session until it returns.
    fresh = make_kv is _private_kv
    meta, secs, verified = parse_verifying(blob, background=model is None or fresh)
    try:
        eng = meta["engine"]
        if not isinstance(eng, dict):
            raise SnapshotFormatError("meta.engine is not an object")
        n_past = _int(meta, "n_past", "meta")
        try:
            offload = policy_from_dict(eng.get("offload", OFFLOAD_NONE))
        except (ValueError, TypeError) as e:
            raise SnapshotFormatError(f"meta.engine.offload is invalid: {e}") from None
        shift = _context_shift(eng)
        shifts = _int(meta, "context_shifts", "meta") if "context_shifts" in meta else 0
        # The model in hand: its checks need not wait for the checksum
        # (an error waits for it below, and reports it first).
        m = _model_for(meta, model, model_path, _no_wait if fresh and model else verified)
    except BaseException:
        verified()
        raise
    try:
        return _restore_checked(
            meta,
            secs,
            verified,
            m,
            eng,
            n_past,
            offload,
            shift,
            shifts,
            threads=threads,
            make_kv=make_kv,
            context_size=context_size,
            defer_kv=defer_kv,
            kv_dtype=kv_dtype,
        )
    except BaseException:
        verified()  # a corrupt file reports its checksum, not what it broke
        raise


def _restore_checked(
    meta: dict[str, Any],
    secs: dict[int, memoryview],
    verified: Callable[[], None],
    m: Model,
    eng: dict[str, Any],
    n_past: int,
    offload: Any,
    shift: ContextShift | None,
    shifts: int,
    *,
    threads: int | None,
    make_kv: MakeKv,
    context_size: int | None,
    defer_kv: bool,
    kv_dtype: str | None,
) -> SessionState:
    """The rest of :func:`restore`, once the model is known; ``verified()``
    is called before anything outside the new state changes."""
    vocab = m.vocab_size
    tokens = S.decode_u32(secs[S.TOKENS], "tokens")
    if len(tokens) != n_past:
        raise SnapshotFormatError(f"tokens section holds {len(tokens)} ids, n_past is {n_past}")
    if tokens and max(tokens) >= vocab:
        raise SnapshotFormatError("tokens section holds ids outside the vocabulary")
    sampler_state = S.decode_sampler_state(secs[S.SAMPLER_STATE])
    # Everything that can fail is checked before the KV import, so a session
    # restored in place (make_kv returning a live one) is untouched on error.
    logits = hidden = None
    if S.LOGITS in secs:
        logits = S.decode_f32(secs[S.LOGITS], vocab, "logits")
    elif S.HIDDEN in secs and n_past:
        hidden = S.decode_f32(secs[S.HIDDEN], int(m.config["n_embd"]), "hidden")
    grammar = _grammar(m, S.decode_json(secs[S.GRAMMAR], "grammar")) if S.GRAMMAR in secs else None
    loras = _loras(m, S.decode_json(secs[S.LORA], "lora")) if S.LORA in secs else {}
    try:
        config = SamplerConfig.from_dict(S.decode_json(secs[S.SAMPLER_CONFIG], "sampler_config"))
        sampler = build_sampler(config, m.tokenizer, vocab)
        snap_dtype = str(eng.get("kv_dtype", "f16"))
        kv_types(snap_dtype)  # an unknown type is a corrupt file
        snap_rot = snap_rot_of(eng)
        prefill_chunk = _int(eng, "prefill_chunk", "meta.engine")
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        n_ctx = (
            context_size if context_size is not None else _int(eng, "context_size", "meta.engine")
        )
        want = _kv_bytes(m, snap_dtype, n_past)
        compacted = compact_every_layer_state(secs[S.KV], want, m.config)
        if compacted is not None:
            secs[S.KV] = compacted
        if len(secs[S.KV]) != want:
            raise SnapshotFormatError(
                f"KV section is {len(secs[S.KV])} bytes, {want} expected for {n_past} positions"
            )
        kv = make_kv(
            m,
            n_ctx,
            threads if threads is not None else _int(eng, "threads", "meta.engine"),
            kv_dtype if kv_dtype is not None else snap_dtype,
        )
    except (ValueError, TypeError, KeyError, OverflowError) as e:
        raise SnapshotFormatError(f"snapshot settings are invalid: {e}") from None
    except OxiLlamaError as e:
        if isinstance(e, SnapshotError):
            raise
        raise SnapshotError(f"cannot rebuild the session: {e}") from e
    try:
        sampler.set_state(sampler_state)
    except (OxiLlamaError, ValueError, OverflowError, TypeError) as e:
        raise SnapshotFormatError(f"snapshot sampler state is invalid: {e}") from None
    if n_past > kv.n_ctx:
        # The file's own context size: a corrupt file. A smaller one given
        # by the caller (a scheduler's context): it does not fit here.
        kind = SnapshotFormatError if kv.n_ctx == n_ctx and context_size is None else SnapshotError
        raise kind(f"the snapshot holds {n_past} positions, the context holds {kv.n_ctx}")
    verified()
    try:
        # Last but the KV import, which cannot fail on a checked file: an
        # error before here leaves the model as it was.
        m.apply_offload(offload)
    except OxiLlamaError as e:
        raise SnapshotError(f"cannot re-apply the snapshot's offload policy: {e}") from e
    m.prepare(kv.threads)
    swapped = None
    kv_data: Any = secs[S.KV]
    if not _state_only(m.config):
        rot = (int(kv.kv_rot[0]), int(kv.kv_rot[1]))
        if kv.kv_dtype != snap_dtype or rot != snap_rot:
            src, dst = (snap_dtype, snap_rot), (kv.kv_dtype, rot)
            warn = kv_dtype is None or _rotated_otherwise(src, dst)
            kv_data = _convert_kv(m, kv_data, n_past, src, dst, warn=warn)
    try:
        if defer_kv:
            swapped = (n_past, bytes(kv_data))
        else:
            kv.import_kv(n_past, kv_data)
    except (OxiLlamaError, ValueError, OverflowError, TypeError) as e:
        raise SnapshotFormatError(f"snapshot session data is invalid: {e}") from None
    kv.prefill_chunk = prefill_chunk
    # Always: a live session restored in place drops adapters it had.
    apply_loras(kv, loras)
    return SessionState(
        model=m,
        kv=kv,
        sampler_config=config,
        sampler=sampler,
        tokens=list(tokens),
        swapped=swapped,
        logits=logits,
        hidden=hidden,
        grammar=grammar,
        loras=loras,
        context_shift=shift,
        shifts=shifts,
    )


def _context_shift(eng: dict[str, Any]) -> ContextShift | None:
    """meta.engine.context_shift: the session's shift policy (absent: off)."""
    d = eng.get("context_shift")
    if d is None:
        return None
    if not isinstance(d, dict):
        raise SnapshotFormatError("meta.engine.context_shift is not an object")
    try:
        return ContextShift(_int(d, "n_keep", "meta.engine.context_shift"))
    except ParameterError as e:
        raise SnapshotFormatError(f"meta.engine.context_shift is invalid: {e}") from None


def lora_entries(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The LORA section's adapter records, checked for shape."""
    entries = d.get("adapters")
    if not isinstance(entries, list):
        raise SnapshotFormatError("lora section has no adapters list")
    out = []
    for e in entries:
        if not (
            isinstance(e, dict)
            and isinstance(e.get("name"), str)
            and isinstance(e.get("path"), str)
            and isinstance(e.get("fingerprint"), str)
            and isinstance(e.get("scale"), (int, float))
            and not isinstance(e.get("scale"), bool)
        ):
            raise SnapshotFormatError(f"lora section holds an invalid adapter record: {e!r}")
        out.append(e)
    return out


def _loras(model: Model, d: dict[str, Any]) -> dict[LoraAdapter, float]:
    """The adapters a snapshot's LORA section names, each loaded from its
    path and checked against its recorded fingerprint."""
    out: dict[LoraAdapter, float] = {}
    for e in lora_entries(d):
        name, path = e["name"], e["path"]
        try:
            adapter = LoraAdapter(model, path, name=name)
        except OxiLlamaError as err:
            raise AdapterMismatchError(
                f"LoRA adapter {name!r} of this snapshot cannot be loaded from {path!r}: {err}",
                name=name,
                path=path,
            ) from err
        if adapter.fingerprint != e["fingerprint"]:
            raise AdapterMismatchError(
                f"LoRA adapter {name!r} at {path!r} has changed since the snapshot "
                f"(BLAKE3 {adapter.fingerprint}, expected {e['fingerprint']})",
                name=name,
                path=path,
            )
        scale = float(e["scale"])
        if scale != scale or abs(scale) == float("inf"):
            raise SnapshotFormatError(f"lora section: adapter {name!r} has scale {scale}")
        out[adapter] = scale
    return out


def _state_only(cfg: dict[str, Any]) -> bool:
    """Whether the KV section holds only a recurrent state (Mamba-2): no
    attention rows, whose types and rotation would matter."""
    return bool(cfg.get("recurrent")) and not cfg.get("hybrid")


def _kv_layers(cfg: dict[str, Any]) -> int:
    """Layers whose keys and values the cache holds (a hybrid's attention
    layers only)."""
    return int(cfg.get("kv_layers", cfg["n_layer"]))


def _kv_layout(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the KV section holds, for readers of the metadata: attention
    keys and values, or (``"recurrent"``) Mamba-2's convolution and SSM
    states, all layers, as little-endian f32; a hybrid's (LFM2,
    Granite-4.0-H) keys and values of its attention layers first, then its
    recurrent state. A model whose last layers reuse earlier layers' keys
    and values (Gemma-3n) holds only the first ``kv_layers``."""
    if _state_only(cfg):
        return {"n_layer": cfg["n_layer"], "recurrent": dict(cfg["ssm"])}
    out = {
        "n_layer": cfg["n_layer"],
        "n_head_kv": cfg["n_head_kv"],
        "dim_k": cfg["dim_k"],
        "dim_v": cfg["dim_v"],
    }
    if _kv_layers(cfg) != cfg["n_layer"]:
        out["kv_layers"] = _kv_layers(cfg)
    if cfg.get("hybrid"):
        out["kv_layers"] = _kv_layers(cfg)
        out["recurrent_layers"] = list(cfg["recurrent_layers"])
        out["recurrent"] = dict(cfg["ssm"])
    return out


def _kv_bytes(model: Model, kv_dtype: str, n: int) -> int:
    """Bytes of the KV section: keys and values of ``n`` positions in the
    cache's types (quantized rows as their blocks), or a recurrent model's
    whole state (the same size at any position), or a hybrid's both."""
    c = model.config
    state = int(c["ssm"]["state_bytes"]) if c.get("recurrent") else 0
    if _state_only(c):
        return state
    per = kv_position_bytes(
        kv_dtype, _kv_layers(c), int(c["n_head_kv"]), int(c["dim_k"]), int(c["dim_v"])
    )
    return n * per + state


def snap_rot_of(eng: dict[str, Any]) -> tuple[int, int]:
    """meta.engine.kv_rot: the Hadamard block sizes of the stored keys and
    values (absent: none, as every snapshot before the rotation)."""
    d = eng.get("kv_rot")
    if d is None:
        return (0, 0)
    if not isinstance(d, dict):
        raise SnapshotFormatError("meta.engine.kv_rot is not an object")
    k, v = _int(d, "k", "meta.engine.kv_rot"), _int(d, "v", "meta.engine.kv_rot")
    for n in (k, v):
        if n & (n - 1):
            raise SnapshotFormatError(f"meta.engine.kv_rot holds {n}, not a power of two")
    return (k, v)


def _rotated_otherwise(src: tuple[str, tuple[int, int]], dst: tuple[str, tuple[int, int]]) -> bool:
    """Whether a side quantized in both caches is rotated differently: a
    setting of the two processes (or builds) differs, which a requested
    change of types does not explain (f16 and f32 are never rotated)."""
    (src_t, src_rot), (dst_t, dst_rot) = src, dst

    def sides(t: str) -> tuple[str, str]:
        k, _, v = t.partition("/")
        return k, v or k

    pairs = zip(sides(src_t), src_rot, sides(dst_t), dst_rot, strict=True)
    quantized = ("q8_0", "q4_0")
    return any(a in quantized and b in quantized and ra != rb for a, ra, b, rb in pairs)


def describe_rot(rot: tuple[int, int]) -> str:
    """``"Hadamard-rotated (keys in blocks of 64, values in blocks of
    64)"``, or ``"unrotated"``."""
    if rot == (0, 0):
        return "unrotated"
    named = zip(("keys", "values"), rot, strict=True)
    parts = [f"{name} in blocks of {n}" for name, n in named if n]
    return f"Hadamard-rotated ({', '.join(parts)})"


def _convert_kv(
    model: Model,
    data: Any,
    n: int,
    src: tuple[str, tuple[int, int]],
    dst: tuple[str, tuple[int, int]],
    *,
    warn: bool,
) -> bytes:
    """A snapshot's KV section in types and rotation ``src`` re-encoded
    into ``dst``."""
    (src_t, src_rot), (dst_t, dst_rot) = src, dst
    what_src, what_dst = src_t, dst_t
    if src_rot != dst_rot:
        what_src = f"{src_t} {describe_rot(src_rot)}"
        what_dst = f"{dst_t} {describe_rot(dst_rot)}"
    if warn:
        hint = (
            "its rows are rotated back or forth (OXILLAMA_ATTN_ROT_DISABLE set in one process "
            "and not the other, or another build); continuations can differ from the saved "
            "session's"
            if _rotated_otherwise(src, dst)
            else "continuations can differ from the saved session's; pass kv_dtype= to ask for "
            "the conversion"
        )
        warnings.warn(
            f"the snapshot's KV cache is {what_src}, this session's is {what_dst}: "
            f"converting it ({hint})",
            RuntimeWarning,
            stacklevel=3,
        )
    c = model.config
    # A hybrid's recurrent state follows its rows, in f32 whatever the
    # cache's types: it travels as it is.
    state = int(c["ssm"]["state_bytes"]) if c.get("hybrid") else 0
    view = memoryview(data)
    rows, tail = view[: len(view) - state], bytes(view[len(view) - state :])
    try:
        return (
            _native.convert_kv(
                rows,
                _kv_layers(c),
                int(c["n_head_kv"]),
                int(c["dim_k"]),
                int(c["dim_v"]),
                n,
                src_t,
                dst_t,
                src_rot,
                dst_rot,
            )
            + tail
        )
    except OxiLlamaError as e:
        raise SnapshotError(
            f"cannot convert the snapshot's {what_src} KV cache to {what_dst}: {e}"
        ) from e


def _grammar(model: Model, d: dict[str, Any]) -> tuple[Grammar, GrammarMatcher]:
    """The grammar and matcher a snapshot's GRAMMAR section describes."""
    source, root, state = d.get("source"), d.get("root"), d.get("state")
    if not isinstance(source, str) or not isinstance(root, str) or not isinstance(state, list):
        raise SnapshotFormatError("grammar section needs source, root and state")
    try:
        grammar = Grammar(source, root=root)
        matcher = grammar.matcher(model.tokenizer)
        matcher.import_state([int(w) for w in state])
    except (OxiLlamaError, ValueError, TypeError, OverflowError) as e:
        raise SnapshotFormatError(f"grammar section is invalid: {e}") from None
    return grammar, matcher


def write_atomic(
    path: str | os.PathLike[str],
    secs: list[Writer],
    *,
    durable: bool = True,
    version: int = VERSION,
) -> None:
    """Writes the sections as one OXISNAP1 file, crash-safely (see
    :func:`~.atomic.replace_file`).

    The sections are filled into a reused file image; its payload goes to
    the file while its checksum is computed (one pool dispatch: one thread
    writes, the others hash), and the header carrying the digest is written
    last, before the fsync and the rename."""
    size = encoded_size(secs)

    def write(fd: int) -> None:
        with _image(size) as image:
            fill_payload(secs, image)
            with image[HEADER.size :] as payload:
                digest = _native.write_checksummed(fd, payload, HEADER.size)
            seal(image, digest, version=version)
            with image[: HEADER.size] as header:
                if os.pwrite(fd, header, 0) != HEADER.size:
                    raise OSError(errno.EIO, "short write of the snapshot header")

    replace_file(path, write, durable=durable)


#: The file image buffer, reused across saves: a fresh 24 MB buffer costs
#: more in page faults than filling it. Grown to the largest snapshot and
#: released when a much smaller one follows. One per process, under a lock.
_IMAGE: list[bytearray] = []
_IMAGE_LOCK = threading.Lock()


@contextlib.contextmanager
def _image(size: int) -> Iterator[memoryview]:
    with _IMAGE_LOCK:
        buf = _IMAGE[0] if _IMAGE else None
        if buf is None or len(buf) < size or len(buf) > 4 * size + (64 << 20):
            buf = bytearray(size)
            _IMAGE[:] = [buf]
        with memoryview(buf) as whole, whole[:size] as view:
            yield view
