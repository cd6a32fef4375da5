"""LoRA adapters: llama.cpp's logits with the same adapters (committed by
tests/lora/make_reference.py), a float64 numpy merge of the weights,
stacking, switching, batching, snapshots and every refusal."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from oxillama import Engine, LoraError, Model, SamplerConfig, _native, snapshot
from oxillama.snapshot import AdapterMismatchError
from tests.lora import adapters, cases
from tests.models._archs import FIXTURES as ARCH_FIXTURES
from tests.models._archs import TYPE_FIXTURES
from tests.models._rewrite import rewrite_f32

REF = Path(__file__).parent / "lora" / "reference"
FIXTURES = Path(__file__).parent / "models" / "fixtures"
META = json.loads((REF / "meta.json").read_text())


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def smol(model_path: Path, lora_dir: Path) -> dict[str, Path]:
    a, b = lora_dir / "smol_a.gguf", lora_dir / "smol_b.gguf"
    assert cases.smol_a(model_path, a) == META["smol_a_sha256"]
    assert cases.smol_b(model_path, b) == META["smol_b_sha256"]
    return {"a": a, "b": b}


@pytest.fixture(scope="module")
def fixture_f32(lora_dir: Path) -> dict[str, Path]:
    base = lora_dir / "llama_f32.gguf"
    assert rewrite_f32(FIXTURES / "llama.gguf", base) == META["fixture_f32_sha256"]
    a = lora_dir / "fixture_a.gguf"
    assert cases.fixture_adapter(base, a) == META["fixture_a_sha256"]
    return {"base": base, "a": a}


def logits(engine: Engine, tokens: list[int], lora: object = None) -> np.ndarray:
    engine.reset()
    engine.set_loras(lora if lora is not None else {})
    out = engine.eval(tokens, all_logits=True)
    engine.clear_loras()
    engine.reset()
    return out


@pytest.fixture(scope="module")
def smol_engine(model_path: Path) -> Engine:
    return Engine(model_path, context_size=256, threads=2, sampler=SamplerConfig.greedy())


# ------------------------------------------------------------- llama.cpp


def test_smollm2_matches_llamacpp_at_two_scales(smol_engine: Engine, smol: dict[str, Path]) -> None:
    ref = np.load(REF / "smollm2.npz")
    pos = list(ref["positions"])
    base = logits(smol_engine, cases.SMOL_TOKENS)[pos]
    base_diff = float(np.abs(base - ref["base"]).max())
    for s in cases.SCALES:
        ours = logits(smol_engine, cases.SMOL_TOKENS, {smol["a"]: s})[pos]
        theirs = ref[f"a_{s}"]
        effect = float(np.abs(theirs - ref["base"]).max())
        diff = float(np.abs(ours - theirs).max())
        print(f"scale {s}: diff {diff:.3f}, base diff {base_diff:.3f}, effect {effect:.2f}")
        # The adapter moves logits by several units; both engines quantize
        # activations for the Q4_1 base (and llama.cpp rounds them to f16
        # for the F16 adapter), so the bar is the base model's difference.
        assert effect > 2.0
        assert diff <= 2.0 * base_diff, (diff, base_diff)
        # Argmax agrees, or llama.cpp's own top two are within that noise.
        for o, t in zip(ours, theirs, strict=True):
            assert t[o.argmax()] >= t.max() - 2.0 * base_diff
    stacked = logits(smol_engine, cases.SMOL_TOKENS, {smol["a"]: 1.0, smol["b"]: 0.7})[pos]
    diff = float(np.abs(stacked - ref["a_1.0_b_0.7"]).max())
    assert diff <= 2.0 * base_diff, (diff, base_diff)


def test_f32_fixture_matches_llamacpp(fixture_f32: dict[str, Path]) -> None:
    """All-F32 weights, adapter and KV: only summation order differs, with
    the embedding and output-head pairs included."""
    ref = np.load(REF / "fixture.npz")
    eng = Engine(fixture_f32["base"], context_size=64, threads=2, kv_dtype="f32")
    base = logits(eng, cases.FIXTURE_TOKENS)
    assert np.abs(base - ref["base"]).max() < 1e-4
    for s in cases.SCALES:
        ours = logits(eng, cases.FIXTURE_TOKENS, {fixture_f32["a"]: s})
        assert np.abs(ref[f"a_{s}"] - ref["base"]).max() > 1.0
        assert np.abs(ours - ref[f"a_{s}"]).max() < 1e-4


# ------------------------------------------------------ float64 merge oracle


def merged(base: Path, adapter_paths: list[tuple[Path, float]], dst: Path) -> None:
    """``dst``: ``base`` with every adapter merged into its weights in
    float64 (``W + s alpha/rank B A``), written as F32."""
    deltas: dict[str, np.ndarray] = {}
    for path, scale in adapter_paths:
        alpha, ab = adapters.read_pairs(path)
        for name, (a, b) in ab.items():
            rank = b.shape[1] if name != "token_embd.weight" else a.shape[1]
            s = scale * alpha / rank if alpha else scale
            d = s * (a @ b.T) if name == "token_embd.weight" else s * (b @ a)
            deltas[name] = deltas.get(name, 0) + d
    r = gguf.GGUFReader(str(base))
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), kind, sub_type=sub)
    for t in r.tensors:
        shape = [int(n) for n in reversed(t.shape)]
        x = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        if t.name in deltas:
            x = x + deltas[t.name]
        w.add_tensor(t.name, x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


ARCHS = sorted(name for name in ARCH_FIXTURES if name != "qwen3moe")


@pytest.mark.parametrize("arch", ARCHS)
def test_equals_float64_merged_weights(arch: str, lora_dir: Path) -> None:
    """Base + adapter (never merged) equals the model whose weights are the
    float64 merge, on F32 weights, for every architecture's fixture (every
    projection, fused qkv and gate/up for phi3, ssm_in/out for mamba2, the
    embedding and head where they are separate)."""
    base = lora_dir / f"{arch}_f32_m.gguf"
    rewrite_f32(FIXTURES / f"{arch}.gguf", base)
    a = lora_dir / f"{arch}_oracle_a.gguf"
    cases.fixture_adapter(base, a, seed=11, dtype="f16")
    b = lora_dir / f"{arch}_oracle_b.gguf"
    cases.fixture_adapter(base, b, seed=12, dtype="q8_0")
    toks = cases.FIXTURE_TOKENS
    eng = Engine(base, context_size=64, threads=2, kv_dtype="f32")
    plain = logits(eng, toks)
    for spec in ([(a, 0.8)], [(a, 1.0), (b, -0.6)]):
        dst = lora_dir / f"{arch}_merged.gguf"
        merged(base, spec, dst)
        oracle = logits(Engine(dst, context_size=64, threads=2, kv_dtype="f32"), toks)
        ours = logits(eng, toks, dict(spec))
        assert np.abs(oracle - plain).max() > 0.5
        # The GELU families go through ggml's f16 GELU table, where float
        # noise at a rounding boundary is a whole table step (as in
        # tests/models against llama.cpp).
        tol = 1e-2 if arch in ("gemma", "gemma2", "gemma3", "gemma3n", "starcoder2") else 2e-4
        assert np.abs(ours - oracle).max() < tol, np.abs(ours - oracle).max()


QUANT_BASES = [n for n, fx in TYPE_FIXTURES.items() if not fx.experts_only]


@pytest.mark.parametrize("name", QUANT_BASES)
def test_new_type_base_matches_llamacpp(name: str, lora_dir: Path) -> None:
    """An adapter on a base whose every matrix (embedding and head
    included) is an i-quant, ternary or MXFP4: llama.cpp's logits, F32 KV
    cache. Both engines give the base's integer block sums exactly, so they
    agree to float noise until an activation rounds to the other Q8 step
    (about 0.1-0.25 on later logits, as in tests/models' one-type checks):
    at BOS, at a quarter of the positions or more, and within that step
    everywhere."""
    ref = np.load(REF / "quant_bases.npz")
    base = FIXTURES / f"{name}.gguf"
    a = lora_dir / f"{name}_a.gguf"
    assert (
        cases.fixture_adapter(base, a, seed=cases.QUANT_BASE_SEED)
        == META["quant_base_adapter_sha256"][name]
    )
    eng = Engine(base, context_size=64, threads=2, kv_dtype="f32")
    for ours, theirs in (
        (logits(eng, cases.FIXTURE_TOKENS), ref[f"{name}_base"]),
        (logits(eng, cases.FIXTURE_TOKENS, {a: 1.0}), ref[f"{name}_a"]),
    ):
        per_position = np.abs(ours - theirs).max(axis=1)
        assert per_position[0] < 1e-4, per_position
        assert (per_position < 1e-4).mean() >= 0.25, per_position
        assert per_position.max() < 0.3, per_position
    assert np.abs(ref[f"{name}_a"] - ref[f"{name}_base"]).max() > 1.0


# --------------------------------------------------------------- semantics


def test_stacked_equals_sum_of_deltas(
    smol_engine: Engine, model_path: Path, lora_dir: Path
) -> None:
    """Two adapters at scales 1 equal one adapter whose pairs are theirs
    side by side in rank (so its delta is the sum of theirs). The ranks are
    interleaved by halves, the order each row's delta is formed in, so the
    arithmetic is the same and so are the bits (on the Q4_1 base any other
    order moves logits by the activation-quantization noise, up to ~1)."""
    arch, shapes = adapters.base_shapes(model_path)
    names = adapters.smollm2_layers()[:70]
    p1 = adapters.pairs(shapes, names, rank=4, seed=21, b_std=0.03)
    p2 = adapters.pairs(shapes, names, rank=8, seed=22, b_std=0.03)
    one, two, both = (lora_dir / f"stack_{n}.gguf" for n in ("one", "two", "both"))
    adapters.write(one, arch, p1, alpha=None)
    adapters.write(two, arch, p2, alpha=None)

    def halves(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> tuple:
        ra, rc = a.shape[0] // 2, c.shape[0] // 2
        aa = np.concatenate([a[:ra], c[:rc], a[ra:], c[rc:]])
        bb = np.concatenate([b[:, :ra], d[:, :rc], b[:, ra:], d[:, rc:]], axis=1)
        return aa, bb

    cat = {n: halves(*p1[n], *p2[n]) for n in names}
    adapters.write(both, arch, cat, alpha=None)
    toks = cases.SMOL_TOKENS
    stacked = logits(smol_engine, toks, [one, two])
    single = logits(smol_engine, toks, both)
    base = logits(smol_engine, toks)
    assert np.abs(stacked - base).max() > 1.0
    assert np.array_equal(stacked, single)


def test_switching_costs_nothing_and_restores_base(
    smol_engine: Engine, smol: dict[str, Path]
) -> None:
    toks = cases.SMOL_TOKENS[:8]
    base = logits(smol_engine, toks)
    with_a = logits(smol_engine, toks, smol["a"])
    assert np.array_equal(logits(smol_engine, toks), base)
    assert np.array_equal(logits(smol_engine, toks, smol["a"]), with_a)
    assert np.array_equal(logits(smol_engine, toks, {smol["a"]: 0.0}), base)


def test_engine_api(model_path: Path, smol: dict[str, Path]) -> None:
    g = SamplerConfig.greedy()
    e = Engine(model_path, context_size=128, threads=2, sampler=g, lora=[(smol["a"], 0.5)])
    [(adapter, scale)] = e.loras.items()
    assert scale == 0.5 and adapter.rank == 8 and adapter.alpha == 16.0
    assert len(adapter.targets) == 210 and adapter.name == "smol_a"
    assert len(adapter.fingerprint) == 64
    with_half = e.generate("Once upon a time", 12).tokens
    e.reset()
    e.clear_loras()
    base = e.generate("Once upon a time", 12).tokens
    e.reset()
    assert e.generate("Once upon a time", 12, lora={adapter: 0.5}).tokens == with_half
    assert e.loras == {}  # the call's adapters were for that call only
    e.reset()
    loaded = e.load_lora(smol["b"], scale=0.3)
    assert list(e.loras.values()) == [0.3] and loaded.rank == 16
    assert e.generate("Once upon a time", 12).tokens not in (base, with_half)


def test_batched_rows_with_different_adapters(model_path: Path, smol: dict[str, Path]) -> None:
    """One forward pass over three sessions (base, A, B): each row's logits
    are those of its session alone, bit for bit."""
    m = Model(model_path)
    a = _native.LoraAdapter(m.native, _native.GgufFile.open(str(smol["a"])))
    b = _native.LoraAdapter(m.native, _native.GgufFile.open(str(smol["b"])))
    sets = [[], [(a, 1.0)], [(b, 0.7), (a, 0.2)]]
    prompts = [cases.SMOL_TOKENS[:5], cases.SMOL_TOKENS[3:9], cases.SMOL_TOKENS[6:10]]
    alone, batch = [], []
    for loras, p in zip(sets, prompts, strict=True):
        s = _native.Session(m.native, 64, 2)
        s.set_loras(loras)
        s.eval(np.asarray(p[:-1], dtype=np.uint32))
        alone.append(s.eval(np.asarray(p[-1:], dtype=np.uint32)))
        t = _native.Session(m.native, 64, 2)
        t.set_loras(loras)
        t.eval(np.asarray(p[:-1], dtype=np.uint32))
        batch.append(t)
    rows = _native.eval_batch(batch, [[p[-1]] for p in prompts])
    for i in range(3):
        assert np.array_equal(rows[i], alone[i]), i
        assert np.array_equal(batch[i].head_logits(batch[i].last_hidden()), alone[i])


# --------------------------------------------------------------- snapshots


def test_snapshot_reapplies_adapters(
    model_path: Path, smol: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    path = tmp_path / "mine.gguf"
    shutil.copy(smol["a"], path)
    e = Engine(
        model_path, context_size=128, threads=2, sampler=SamplerConfig(seed=5, temperature=0.8)
    )
    e.load_lora(path, scale=0.8)
    e.load_lora(smol["b"], scale=0.3)
    whole = e.generate("Once upon a time", 30).tokens
    e.reset()
    e.set_sampler(SamplerConfig(seed=5, temperature=0.8))
    first = e.generate("Once upon a time", 12).tokens
    snap = tmp_path / "s.oxisnap"
    e.snapshot(snap)
    info = snapshot.info(snap)
    assert [(x["name"], x["scale"]) for x in info.loras] == [("mine", 0.8), ("smol_b", 0.3)]
    r = Engine.restore(snap)
    assert [(a.name, s) for a, s in r.loras.items()] == [("mine", 0.8), ("smol_b", 0.3)]
    assert first + r.generate("", 18).tokens == whole
    # A changed adapter, then a missing one: errors naming it.
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(AdapterMismatchError, match=r"'mine'.*changed"):
        Engine.restore(snap)
    path.unlink()
    with pytest.raises(AdapterMismatchError, match=r"'mine'.*cannot be loaded"):
        Engine.restore(snap)


# ----------------------------------------------------------------- refusals


def write_bad(tmp: Path, model_path: Path, **kw: object) -> Path:
    arch, shapes = adapters.base_shapes(model_path)
    names = kw.pop("names", ["blk.0.attn_q.weight"])
    ab = adapters.pairs(shapes, names, rank=4, seed=9, b_std=0.01)  # type: ignore[arg-type]
    mutate = kw.pop("mutate", None)
    if mutate is not None:
        ab = mutate(ab)  # type: ignore[operator]
    dst = tmp / "bad.gguf"
    adapters.write(dst, str(kw.pop("arch", arch)), ab, alpha=4.0, **kw)  # type: ignore[arg-type]
    return dst


def test_refusals_name_what_is_wrong(smol_engine: Engine, model_path: Path, tmp_path: Path) -> None:
    def refused(path: Path, pattern: str) -> None:
        with pytest.raises(LoraError, match=pattern):
            smol_engine.load_lora(path)

    refused(write_bad(tmp_path, model_path, arch="gemma3"), 'architecture "gemma3"')
    refused(write_bad(tmp_path, model_path, general_type="model"), "general.type")
    drop_b = lambda ab: {k: (v[0], v[1]) for k, v in ab.items()}  # noqa: E731
    refused(
        write_bad(
            tmp_path, model_path, mutate=lambda ab: {k: (v[0], v[1][:-1]) for k, v in ab.items()}
        ),
        r"blk\.0\.attn_q\.weight has the wrong shape",
    )
    refused(
        write_bad(
            tmp_path, model_path, mutate=lambda ab: {k: (v[0][:3], v[1]) for k, v in ab.items()}
        ),
        r"blk\.0\.attn_q\.weight .*ranks",
    )
    refused(
        write_bad(
            tmp_path, model_path, extra_tensors={"blk.0.attn_norm.weight": np.ones(576, np.float32)}
        ),
        r"blk\.0\.attn_norm\.weight is not a \.lora_a / \.lora_b",
    )
    refused(
        write_bad(
            tmp_path,
            model_path,
            extra_tensors={"blk.0.attn_k.weight.lora_a": np.ones((4, 576), np.float32)},
        ),
        r"pair for blk\.0\.attn_k\.weight is missing its lora_b",
    )
    # SmolLM2's head is its embedding: neither is offered.
    emb = write_bad(
        tmp_path,
        model_path,
        names=[],
        extra_tensors={
            "token_embd.weight.lora_a": np.ones((49152, 4), np.float32),
            "token_embd.weight.lora_b": np.ones((576, 4), np.float32),
        },
    )
    refused(emb, r"token_embd\.weight is not supported")
    missing = write_bad(
        tmp_path,
        model_path,
        names=[],
        extra_tensors={
            "blk.40.attn_q.weight.lora_a": np.ones((4, 576), np.float32),
            "blk.40.attn_q.weight.lora_b": np.ones((576, 4), np.float32),
        },
    )
    refused(missing, r"blk\.40\.attn_q\.weight does not exist in the base model")
    assert drop_b  # keeps the helper for readers of the pattern above
    other = Engine(FIXTURES / "llama.gguf", context_size=32, threads=2)
    adapter = smol_engine.load_lora(write_bad(tmp_path, model_path))
    smol_engine.clear_loras()
    with pytest.raises(LoraError, match="another model"):
        other.set_loras(adapter)


def test_moe_experts_are_refused(lora_dir: Path) -> None:
    base = FIXTURES / "qwen3moe.gguf"
    arch, shapes = adapters.base_shapes(base)
    name = next(n for n in shapes if "ffn_gate_inp" in n)
    dst = lora_dir / "moe.gguf"
    adapters.write(dst, arch, adapters.pairs(shapes, [name], rank=2, seed=1, b_std=0.1), alpha=2.0)
    with pytest.raises(LoraError, match=rf"{name.replace('.', '[.]')} is not supported"):
        Engine(base, context_size=32, threads=2).load_lora(dst)
