"""llama.cpp's context shift (``context_shift=True, n_keep=N``): greedy
SmolLM2 through several shifts against llama.cpp's own shift
(``reference/context_shift_smollm2.json``, made by
``reference/make_context_shift_reference.py``), the default "length" end,
snapshots of shifted sessions, the scheduler's sessions, the serve flags
and the refusal of recurrent models."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import oxillama._native as _native
from oxillama import AsyncEngine, Engine, GenerateError, ParameterError, SamplerConfig
from oxillama.serving.flags import serve_options_from_mapping
from oxillama.sessions.session import parse
from tests._context_shift import shifted

#: llama.cpp's best two logits closer than this are a near-tie: numerics
#: of the two implementations (not the shift) may order them either way.
NEAR_TIE = 0.01
REF: dict[str, Any] = json.loads(
    (Path(__file__).parent / "reference" / "context_shift_smollm2.json").read_text()
)


def shift_steps(case: dict[str, Any], turn: int) -> list[int]:
    """Steps of a turn before whose token llama.cpp shifted."""
    pos, steps = 0, []
    n_ctx, keep = case["n_ctx"], case["n_keep"]
    for i, t in enumerate(case["turns"]):
        n = len(t["prompt_ids"])
        while pos + n > n_ctx:
            pos -= (pos - keep) // 2
        pos += n
        for step in range(len(t["ids"])):
            if pos + 1 > n_ctx:
                pos -= (pos - keep) // 2
                if i == turn:
                    steps.append(step)
            pos += 1
    return steps


@pytest.mark.parametrize("name", ["count_ctx64_keep8", "chat_ctx64_keep8"])
def test_greedy_tokens_match_llama_cpp_through_shifts(model_path: Path, name: str) -> None:
    case = REF["cases"][name]
    turn = case["turns"][0]
    e = shifted(model_path, case["n_ctx"], case["n_keep"])
    assert e.tokenize(turn["prompt"], add_special=False) == turn["prompt_ids"]
    out = e.generate(turn["prompt_ids"], len(turn["ids"]), ignore_eos=True)
    ours, ref = out.tokens, turn["ids"]
    same = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), len(ref))
    steps = shift_steps(case, 0)
    assert len(steps) >= 3
    if same < len(ref):
        # Only a near-tie may part the two, and only after two shifts.
        assert turn["top2_gap"][same] < NEAR_TIE, (same, turn["top2_gap"][same])
        assert same > steps[1], (same, steps)
    else:
        assert e.context_shifts == len(case["shifts"])
        assert out.finish_reason == "length"
    if name == "count_ctx64_keep8":
        assert same == len(ref) == 130  # every token, through 3 shifts


def teacher_forced(e: Engine, case: dict[str, Any], on_full: Any = None) -> dict[str, list[float]]:
    """Feeds ``e`` llama.cpp's tokens of ``case`` and returns, before and
    after its first shift, the largest difference per step between its
    logits and llama.cpp's at llama.cpp's best 4 tokens. ``on_full(e)``, if
    given, replaces the engine's own first shift."""
    diffs: dict[str, list[float]] = {"before": [], "after": []}
    for turn in case["turns"]:
        e.generate(turn["prompt_ids"], 0)
        for step, tok in enumerate(turn["ids"]):
            logits = e._last_logits
            assert logits is not None
            ids, want = turn["top_ids"][step], np.asarray(turn["top_logits"][step])
            diff = float(np.max(np.abs(logits[ids] - want)))
            diffs["after" if e.context_shifts else "before"].append(diff)
            if on_full is not None and e.n_past == e.n_ctx and e.context_shifts == 0:
                on_full(e)
            e.generate([tok], 0)
    return diffs


@pytest.mark.parametrize("name", sorted(REF["cases"]))
def test_teacher_forced_logits_match_llama_cpp_after_shifts(model_path: Path, name: str) -> None:
    """Fed llama.cpp's tokens, the engine shifts where llama.cpp did, and
    its logits stay as close to llama.cpp's after the shifts as before
    them (the two differ by their Q4_1 matmuls' rounding: a few tenths at
    most, about 0.25 on average, shift or no shift)."""
    case = REF["cases"][name]
    e = shifted(model_path, case["n_ctx"], case["n_keep"])
    diffs = teacher_forced(e, case)
    assert e.context_shifts == len(case["shifts"]) >= 3
    assert len(diffs["after"]) >= 80
    assert max(diffs["before"] + diffs["after"]) < 1.0
    assert float(np.mean(diffs["after"])) < 0.35


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_rotated_quantized_caches_shift_as_llama_cpp(model_path: Path, kv: str) -> None:
    """A quantized cache holds its keys Hadamard-rotated (after RoPE), and
    the rotation does not commute with RoPE: the shift rotates each kept
    key back, re-applies RoPE and rotates it again, as llama.cpp's K-shift
    of a rotated cache does. Fed llama.cpp's tokens, the logits stay as
    close to llama.cpp's (f16) after the shifts as before them; a shift
    that re-rotated the stored rows directly would leave them about as far
    as no re-rotation at all (the control above: more than 1.0)."""
    for name, case in sorted(REF["cases"].items()):
        e = shifted(model_path, case["n_ctx"], case["n_keep"], kv_dtype=kv)
        assert e._session.kv_rot == (64, 64)
        diffs = teacher_forced(e, case)
        assert e.context_shifts == len(case["shifts"]) >= 3, name
        before, after = float(np.mean(diffs["before"])), float(np.mean(diffs["after"]))
        print(kv, name, {"before": before, "after": after})
        # q8_0 as the f16 cache (0.35); q4_0 by its own noise before the shifts.
        assert after < (0.35 if kv == "q8_0" else max(0.5, 1.5 * before)), (name, before, after)


def test_a_shift_without_re_rotation_would_be_caught(model_path: Path) -> None:
    """The control: the same first shift, made without rotating the kept
    keys (rows moved as they are, through export/import), leaves the
    logits far from llama.cpp's, so the comparison above sees the rotation."""
    case = REF["cases"]["count_ctx64_keep8"]
    e = shifted(model_path, case["n_ctx"], case["n_keep"])
    cfg = e.config
    layers, heads, dk, dv = cfg["n_layer"], cfg["n_head_kv"], cfg["dim_k"], cfg["dim_v"]

    def unrotated(e: Engine) -> None:
        kv, n, keep = e._session, e.n_past, case["n_keep"]
        discard = (n - keep) // 2
        rows = [*range(keep), *range(keep + discard, n)]
        raw = np.frombuffer(kv.export_kv(), dtype=np.float16).reshape(layers, -1)
        out = []
        for layer in raw:
            k = layer[: heads * n * dk].reshape(heads, n, dk)
            v = layer[heads * n * dk :].reshape(heads, n, dv)
            out += [k[:, rows].ravel(), v[:, rows].ravel()]
        kv.import_kv(n - discard, np.concatenate(out).tobytes())
        del e._state.tokens[keep : keep + discard]
        e._state.shifts += 1

    diffs = teacher_forced(e, case, on_full=unrotated)
    # Between the broken first shift and the engine's own second one.
    wrong = diffs["after"][: shift_steps(case, 0)[1] - shift_steps(case, 0)[0]]
    assert float(np.mean(wrong)) > 1.0


def test_shift_off_ends_with_length_as_before(model_path: Path) -> None:
    prompt = REF["cases"]["count_ctx64_keep8"]["turns"][0]["prompt_ids"]
    off = Engine(model_path, context_size=64, threads=2, sampler=SamplerConfig.greedy())
    assert off.context_shift is None
    out = off.generate(prompt, 100, ignore_eos=True)
    assert out.finish_reason == "length" and len(out.tokens) == 64 - len(prompt)
    assert off.n_past == 64 and off.context_shifts == 0
    with pytest.raises(GenerateError, match="does not fit"):
        off.generate(prompt, 1)
    on = shifted(model_path, 64, 8)
    out = on.generate(prompt, 100, ignore_eos=True)
    assert out.finish_reason == "length" and len(out.tokens) == 100
    assert on.context_shifts == 2 and on.n_past < 64
    assert on.tokens[:8] == prompt[:8] and len(on.tokens) == on.n_past
    # A prompt that does not fit what is left shifts first, as often as it
    # takes: 61 + 34 > 64, then (61 - 26) + 34 > 64, then 22 + 34 fits.
    assert on.n_past == 61
    before = on.context_shifts
    on.generate(prompt * 2, 1)
    assert on.context_shifts == before + 2 and on.n_past == 22 + 34 + 1
    # n_keep near the context size leaves nothing to drop: "length" again.
    tight = shifted(model_path, 32, 31)
    out = tight.generate(prompt, 40, ignore_eos=True)
    assert out.finish_reason == "length" and tight.n_past == 32


CHILD = """
import json, sys
from oxillama import Engine
e = Engine.restore(sys.argv[1])
print(json.dumps({"tokens": e.generate("", 60, ignore_eos=True).tokens,
                  "shifts": e.context_shifts, "keep": e.context_shift.n_keep}))
"""


def test_a_shifted_session_continues_exactly_in_another_process(
    model_path: Path, tmp_path: Path
) -> None:
    prompt = REF["cases"]["chat_ctx64_keep8"]["turns"][0]["prompt_ids"]
    whole = shifted(model_path, 64, 6)
    first = whole.generate(prompt, 80, ignore_eos=True).tokens
    assert whole.context_shifts == 2
    path = tmp_path / "shifted.oxisnap"
    whole.snapshot(path)
    meta, _ = parse(path.read_bytes())
    assert meta["engine"]["context_shift"] == {"n_keep": 6}
    assert meta["context_shifts"] == 2
    rest = whole.generate("", 60, ignore_eos=True).tokens
    assert whole.context_shifts > 2
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    child = json.loads(run.stdout.strip().splitlines()[-1])
    assert child == {"tokens": rest, "shifts": whole.context_shifts, "keep": 6}
    assert len(first) == 80


def test_async_sessions_shift_like_the_engine(model_path: Path) -> None:
    prompt = REF["cases"]["chat_ctx64_keep8"]["turns"][0]["prompt_ids"]
    follow = [3124, 314]
    sync = shifted(model_path, 64, 8)
    want = [
        sync.generate(prompt, 70, ignore_eos=True).tokens,
        sync.generate(follow, 40, ignore_eos=True).tokens,
    ]

    async def main() -> tuple[list[list[int]], list[int], list[str], bytes]:
        async with AsyncEngine(
            model_path,
            context_size=64,
            threads=2,
            sampler=SamplerConfig.greedy(),
            context_shift=True,
            n_keep=8,
        ) as e:
            s = e.session()
            a = await s.generate(prompt, 70, ignore_eos=True)
            b = await s.generate(follow, 40, ignore_eos=True)
            return (
                [a.tokens, b.tokens],
                s.tokens,
                [a.finish_reason, b.finish_reason],
                (await s.snapshot_bytes()),
            )

    got, held, finish, blob = asyncio.run(main())
    assert got == want and held == sync.tokens and finish == ["length", "length"]
    assert Engine.restore_bytes(blob).context_shifts == sync.context_shifts >= 3

    async def off() -> tuple[str, int, int]:
        async with AsyncEngine(
            model_path, context_size=64, threads=2, sampler=SamplerConfig.greedy()
        ) as e:
            s = e.session()
            a = await s.generate(prompt, 70, ignore_eos=True)
            with pytest.raises(GenerateError, match="does not fit"):
                await s.generate(follow, 40, ignore_eos=True)
            return a.finish_reason, len(a.tokens), s.n_past

    assert asyncio.run(off()) == ("length", 64 - len(prompt), 64)


def test_serve_flags_reach_the_engine() -> None:
    spec, _ = serve_options_from_mapping({"context_shift": "true", "keep": "4"})
    assert (spec.context_shift, spec.n_keep) == (True, 4)
    spec, _ = serve_options_from_mapping({})
    assert (spec.context_shift, spec.n_keep) == (False, 0)


def test_recurrent_models_and_bad_n_keep_are_refused(model_path: Path) -> None:
    from tests.models import _checks as arch

    path = arch.reference("mamba2").path
    with pytest.raises(ParameterError, match="recurrent mamba2"):
        Engine(path, context_size=64, context_shift=True)
    with pytest.raises(ParameterError, match="recurrent mamba2"):
        AsyncEngine(path, context_size=64, context_shift=True)
    e = Engine(path, context_size=64)
    e.eval([1, 2, 3, 4])
    with pytest.raises(ParameterError, match="mamba2"):
        e._session.shift(1, 2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ParameterError, match="n_keep"):
            Engine(model_path, context_size=64, context_shift=True, n_keep=bad)  # type: ignore[arg-type]
    assert isinstance(e._session, _native.Session)


def test_serve_sessions_shift_over_http(model_path: Path) -> None:
    """``oxillama serve --context-shift --keep 4``'s app: session turns
    run past the context size (a request's max_tokens stays at most the
    context size) and come back with every token asked for; without the
    shift the first would end early and the second not fit."""
    import urllib.request

    from oxillama.serving.http.app_spec import AppSpec
    from tests._serve import serving_app

    spec, _ = serve_options_from_mapping(
        {
            "model": str(model_path),
            "context_size": "64",
            "threads": "2",
            "context_shift": "true",
            "keep": "4",
        }
    )
    assert isinstance(spec, AppSpec)
    app = spec.build()
    engine = app.state.server.engine
    assert engine.engine.context_shift is not None and engine.engine.context_shift.n_keep == 4
    assert len(engine.engine.tokenize("1, 2, 3,")) + 60 > 64
    body = {"prompt": "1, 2, 3,", "max_tokens": 60, "ignore_eos": True, "temperature": 0}
    with serving_app(app, engine) as url:
        outs = []
        for _ in range(2):
            req = urllib.request.Request(
                url + "/v1/completions",
                json.dumps({**body, "session": "s"}).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                outs.append(json.loads(r.read()))
    for out in outs:
        assert out["usage"]["completion_tokens"] == 60, out
        assert out["choices"][0]["finish_reason"] == "length"
