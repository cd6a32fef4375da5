"""OXISPEC1: a speculative-decoding session (target and draft OXISNAP1
snapshots, the accepted-token history, held-back tokens, the accept/reject
RNG state, the live sampler configs and states of target and draft (history,
mirostat's mu) and the acceptance statistics). Same container as OXISNAP1 with
its own magic; see docs/snapshot-format.md. An n-gram draft has no DRAFT
section: ``meta.draft`` names the method, its parameters and its agreement
estimates (its index is rebuilt from the token history)."""

from __future__ import annotations

import datetime as _dt
import os
import secrets
from typing import TYPE_CHECKING, Any

import numpy as np

from oxillama._native import __version__
from oxillama.errors import ParameterError, SnapshotError, SnapshotFormatError
from oxillama.sessions import sections as S
from oxillama.sessions.atomic import refuse_temp, write_bytes
from oxillama.sessions.format import Section, decode, encode

if TYPE_CHECKING:
    from oxillama.decoding.ngram_draft import NgramDraft
    from oxillama.engine.speculative import SpeculativeEngine

MAGIC = b"OXISPEC1"
VERSION = 1
META, TARGET, DRAFT = 1, 2, 3


def dumps(spec: SpeculativeEngine) -> bytes:
    from oxillama.decoding.ngram_draft import NgramDraft

    spec._drop_lookahead()
    spec._sync()
    draft = spec.draft
    if isinstance(draft, NgramDraft):
        assert spec._ng is not None
        described: dict[str, Any] = {"method": "ngram", **draft.params(), **spec._ng.export()}
    else:
        described = {"method": "model"}
    meta = {
        "draft": described,
        "num_speculative": spec.num_speculative,
        "seed": spec.seed,
        "async_draft": spec.async_draft,
        "draft_key": spec._draft_key,
        "tokens": spec._tokens,
        "ahead": spec._ahead,
        "ahead_complete": spec._ahead_complete,
        "ahead_ps": [list(p) for p in spec._ahead_ps],
        "sampler": {
            "config": spec._cfg.to_dict(),
            "draft_config": None if spec.draft_sampler is None else spec.draft_sampler.to_dict(),
            "target_state": spec._ts.get_state(),
            "draft_state": None if spec._ds is None else spec._ds.get_state(),
        },
        "rng": spec._rng.bit_generator.state,
        "stats": {
            "rounds": spec.stats.rounds,
            "drafted": spec.stats.drafted,
            "accepted": spec.stats.accepted,
            "rejected": spec.stats.rejected,
            "ahead_used": spec.stats.ahead_used,
            "ahead_cancelled": spec.stats.ahead_cancelled,
            "bonus": spec.stats.bonus,
        },
        "grammar": None
        if spec._grammar is None or spec._matcher is None
        else {
            "source": spec._grammar.source,
            "root": spec._grammar.root,
            "state": spec._matcher.export_state(),
        },
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "library_version": __version__,
    }
    secs = [Section(META, S.encode_json(meta)), Section(TARGET, spec.target.snapshot_bytes())]
    if not isinstance(draft, NgramDraft):
        secs.append(Section(DRAFT, draft.snapshot_bytes()))
    return encode(
        secs,
        magic=MAGIC,
        version=VERSION,
    )


def _u64(v: Any) -> bool:
    """Seeds and draw keys are 64-bit: anything else would fail later,
    untyped, inside numpy."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64


def _ints(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(t, int) and t >= 0 for t in v):
        raise SnapshotFormatError(f"{what} must be a list of token ids")
    return v


def loads(
    blob: bytes | bytearray | memoryview,
    *,
    target_model_path: str | os.PathLike[str] | None = None,
    draft_model_path: str | os.PathLike[str] | None = None,
) -> SpeculativeEngine:
    from oxillama.engine.engine import Engine
    from oxillama.engine.speculative import SpeculativeEngine, SpeculativeStats

    _, secs = decode(blob, magic=MAGIC)
    for tag, name in ((META, "meta"), (TARGET, "target")):
        if tag not in secs:
            raise SnapshotFormatError(f"missing required section: {name}")
    meta = S.decode_json(secs[META], "meta")
    described = meta.get("draft", {"method": "model"})
    method = described.get("method") if isinstance(described, dict) else None
    if method not in ("model", "ngram"):
        raise SnapshotFormatError(f"meta.draft names an unknown draft method: {method!r}")
    if method == "model" and DRAFT not in secs:
        raise SnapshotFormatError("missing required section: draft")
    if method == "ngram" and DRAFT in secs:
        raise SnapshotFormatError("an n-gram draft's snapshot has a draft model section")
    if method == "ngram" and draft_model_path is not None:
        raise ParameterError("draft_model_path was given, but this snapshot's draft is n-gram")
    tokens = _ints(meta.get("tokens"), "meta.tokens")
    ahead = _ints(meta.get("ahead"), "meta.ahead")
    k, seed, stats = meta.get("num_speculative"), meta.get("seed"), meta.get("stats")
    if not isinstance(k, int) or not (seed is None or isinstance(seed, int)):
        raise SnapshotFormatError("meta.num_speculative / meta.seed are invalid")
    if not isinstance(stats, dict):
        raise SnapshotFormatError("meta.stats is not an object")
    ngram = _ngram_draft(described) if method == "ngram" else None
    target = Engine.restore_bytes(bytes(secs[TARGET]), model_path=target_model_path)
    engines = [(target, "target")]
    draft: Engine | NgramDraft
    if ngram is None:
        draft = Engine.restore_bytes(bytes(secs[DRAFT]), model_path=draft_model_path)
        engines.append((draft, "draft"))
    else:
        draft = ngram
        if k != ngram.num_speculative:
            raise SnapshotFormatError("meta.num_speculative differs from meta.draft's")
    for eng, name in engines:
        if eng.tokens != tokens[: eng.n_past] or eng.n_past > max(len(tokens) - 1, 0):
            raise SnapshotFormatError(f"the {name} session does not match the token history")
    async_draft, key = meta.get("async_draft", False), meta.get("draft_key", seed)
    if not isinstance(async_draft, bool) or not (key is None or _u64(key)):
        raise SnapshotFormatError("meta.async_draft / meta.draft_key are invalid")
    if not (seed is None or _u64(seed)):
        raise SnapshotFormatError("meta.seed is not an integer in [0, 2**64)")
    spec = SpeculativeEngine.__new__(SpeculativeEngine)
    spec._adopt(target, draft, k, seed, async_draft)
    spec._draft_key = key if key is not None else secrets.randbits(63)
    spec._tokens = list(tokens)
    spec._ahead = list(ahead)
    done = meta.get("ahead_complete")
    if not (done is None or (isinstance(done, int) and 0 <= done < max(len(ahead), 1))):
        raise SnapshotFormatError("meta.ahead_complete is invalid")
    spec._ahead_complete = done
    spec._complete_at = None
    try:
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = meta["rng"]
        spec.stats = SpeculativeStats(
            int(stats["rounds"]),
            int(stats["drafted"]),
            int(stats["accepted"]),
            int(stats.get("rejected", 0)),
            int(stats.get("ahead_used", 0)),
            int(stats.get("ahead_cancelled", 0)),
            int(stats.get("bonus", 0)),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        # numpy raises OverflowError for a state word past 128 bits.
        raise SnapshotFormatError(f"meta.rng or meta.stats is invalid: {e}") from None
    spec._rng = rng
    _samplers(spec, meta, len(ahead))
    spec._ng = None
    spec._prompt_logits = None
    if ngram is not None:
        spec._ng = ngram.new_state(tokens)
        try:
            spec._ng.load(described)
        except (TypeError, ValueError) as e:
            raise SnapshotFormatError(f"meta.draft is invalid: {e}") from None
    spec._grammar, spec._matcher = None, None
    g = meta.get("grammar")
    if g is not None:
        from oxillama.sessions.session import _grammar

        spec._grammar, spec._matcher = _grammar(target.model, g if isinstance(g, dict) else {})
    return spec


def _samplers(spec: SpeculativeEngine, meta: dict[str, Any], n_ahead: int) -> None:
    """The live sampler configs and states; a snapshot from before they were
    saved continues with fresh ones for the target engine's config (its
    sampler stages then read no history)."""
    from oxillama.decoding.sampling import SamplerConfig

    raw = meta.get("sampler")
    ps = meta.get("ahead_ps", [[None, None]] * n_ahead if raw is None else None)
    try:
        if not isinstance(ps, list) or len(ps) != n_ahead:
            raise ValueError("meta.ahead_ps does not match meta.ahead")
        ahead_ps: list[tuple[float | None, float | None]] = []
        for p in ps:
            if not (isinstance(p, list) and len(p) == 2):
                raise ValueError("meta.ahead_ps entries are [p, q] pairs")
            a, b = p
            ahead_ps.append((None if a is None else float(a), None if b is None else float(b)))
        spec._ahead_ps = ahead_ps
        if raw is None:
            spec._set_sampler(spec.target.sampler)
            return
        if not isinstance(raw, dict):
            raise ValueError("meta.sampler is not an object")
        dcfg = raw.get("draft_config")
        spec.draft_sampler = None if dcfg is None else SamplerConfig.from_dict(dcfg)
        spec._set_sampler(SamplerConfig.from_dict(raw["config"]))
        spec._ts.set_state(raw["target_state"])
        if spec._ds is not None:
            spec._ds.set_state(raw["draft_state"])
    except (KeyError, TypeError, ValueError, OverflowError, ParameterError) as e:
        raise SnapshotFormatError(f"meta.sampler is invalid: {e}") from None


def _ngram_draft(described: dict[str, Any]) -> NgramDraft:
    from oxillama.decoding.ngram_draft import NgramDraft

    try:
        return NgramDraft(
            n_max=described["n_max"],
            n_min=described["n_min"],
            num_speculative=described["num_speculative"],
        )
    except (KeyError, ParameterError) as e:
        raise SnapshotFormatError(f"meta.draft's n-gram parameters are invalid: {e}") from None


def dump(spec: SpeculativeEngine, path: str | os.PathLike[str], *, durable: bool = True) -> None:
    """Writes OXISPEC1 crash-safely, like an OXISNAP1 save."""
    write_bytes(path, dumps(spec), durable=durable)


def load(
    path: str | os.PathLike[str],
    *,
    target_model_path: str | os.PathLike[str] | None = None,
    draft_model_path: str | os.PathLike[str] | None = None,
) -> SpeculativeEngine:
    refuse_temp(path)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise SnapshotError(f"cannot read snapshot {str(path)!r}: {e}") from e
    return loads(blob, target_model_path=target_model_path, draft_model_path=draft_model_path)
