"""``Engine.perplexity`` and ``oxillama perplexity`` against llama.cpp's
``llama-perplexity`` (tests/reference/perplexity_llamacpp.json, made by
make_perplexity_reference.py over perplexity_text.txt) and against a float64
recomputation from the engine's own logits."""

from __future__ import annotations

import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oxillama.cli import main as cli
from oxillama.engine.engine import Engine
from oxillama.engine.perplexity import Perplexity, PerplexityProgress
from oxillama.errors import LoadError, OxiLlamaError, ParameterError
from tests._gguf_meta import ModelMissing, gemma3_path

REF = Path(__file__).parent / "reference"
TEXT_PATH = REF / "perplexity_text.txt"
TEXT = TEXT_PATH.read_text(encoding="utf-8")
LLAMACPP = json.loads((REF / "perplexity_llamacpp.json").read_text(encoding="utf-8"))
FINAL = re.compile(r"^Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})$", re.M)


@pytest.fixture(scope="module")
def smol(model_path: Path) -> Engine:
    return Engine(model_path, context_size=512, threads=2)


@pytest.fixture(scope="module")
def gemma() -> Engine:
    try:
        path = gemma3_path()
    except ModelMissing as e:  # fail, never skip
        pytest.fail(str(e), pytrace=False)
    return Engine(path, context_size=512, threads=2)


@pytest.fixture(scope="module")
def smol_512(smol: Engine) -> Perplexity:
    """The reference's settings: -c 512, 3 chunks."""
    return smol.perplexity(TEXT, n_ctx=LLAMACPP["n_ctx"], chunks=LLAMACPP["chunks"])


def _nll64(logits: np.ndarray, tokens: list[int], first: int) -> np.ndarray:
    """Negative log-likelihoods of tokens[first+1:] from the logits at
    [first, n-1), entirely in float64."""
    rows = logits[first:-1].astype(np.float64)
    top = rows.max(axis=1)
    lse = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    return lse - rows[np.arange(rows.shape[0]), tokens[first + 1 :]]


def _check_against_llamacpp(ours: Perplexity, name: str) -> None:
    ref = LLAMACPP["models"][name]
    assert ours.n_chunks == LLAMACPP["chunks"] and ours.n_ctx == LLAMACPP["n_ctx"]
    assert abs(ours.ppl / ref["ppl"] - 1) < 0.005, (ours.ppl, ref["ppl"])
    assert abs(ours.ppl_error / ref["ppl_error"] - 1) < 0.02, (ours.ppl_error, ref["ppl_error"])
    assert len(ours.running_ppl) == len(ref["running_ppl"])


def test_smollm2_matches_llama_perplexity(smol_512: Perplexity) -> None:
    _check_against_llamacpp(smol_512, "smollm2")


def test_gemma3_matches_llama_perplexity(gemma: Engine) -> None:
    # Gemma adds BOS: each chunk's first token is replaced by it.
    assert gemma.tokenizer.add_bos
    ours = gemma.perplexity(TEXT, n_ctx=LLAMACPP["n_ctx"], chunks=LLAMACPP["chunks"])
    _check_against_llamacpp(ours, "gemma3")


def test_chunks_score_their_second_half(smol: Engine, smol_512: Perplexity) -> None:
    r = smol_512
    assert r.n_tokens == 3 * (512 - 512 // 2 - 1) == 765
    tokens = smol.tokenize(TEXT, add_special=True, parse_special=False)
    assert r.n_text_tokens == len(tokens) and len(tokens) // 512 > 3  # --chunks capped it
    assert len(r.chunk_ppl) == len(r.running_ppl) == 3
    assert r.running_ppl[-1] == r.ppl
    # Every chunk scores as many tokens: the estimate is their geometric mean.
    assert math.isclose(math.exp(np.mean(np.log(r.chunk_ppl))), r.ppl, rel_tol=1e-12)
    assert math.isclose(math.exp(np.mean(np.log(r.chunk_ppl[:2]))), r.running_ppl[1])
    assert r.eval_seconds > 0 and r.total_seconds >= r.eval_seconds + r.score_seconds
    assert r.tokens_per_second > 0
    assert smol.n_past == 0  # the engine is left empty


def test_scoring_matches_float64_recomputation(smol: Engine) -> None:
    seen: list[PerplexityProgress] = []
    r = smol.perplexity(TEXT, n_ctx=128, chunks=1, on_chunk=seen.append)
    tokens = smol.tokenize(TEXT, add_special=True, parse_special=False)[:128]
    smol.reset()
    nll = _nll64(smol.eval(tokens, all_logits=True), tokens, 64)
    smol.reset()
    assert r.n_tokens == nll.size == 63
    assert math.isclose(r.ppl, math.exp(nll.mean()), rel_tol=1e-7)
    # llama.cpp's ±: the standard error of the mean nll, times the estimate.
    se = math.sqrt(((nll * nll).mean() - nll.mean() ** 2) / (nll.size - 1))
    assert math.isclose(r.ppl_error, se * r.ppl, rel_tol=1e-6)
    assert [(p.chunk, p.n_chunks) for p in seen] == [(0, 1), (1, 1)]
    assert math.isnan(seen[0].ppl) and seen[1].ppl == r.ppl


def test_each_chunk_starts_with_bos_where_the_model_adds_it(gemma: Engine) -> None:
    n = 64
    r = gemma.perplexity(TEXT, n_ctx=n, chunks=2)
    tokens = gemma.tokenize(TEXT, add_special=True, parse_special=False)
    second = [gemma.tokenizer.bos_id, *tokens[n + 1 : 2 * n]]
    assert tokens[n] != second[0]
    gemma.reset()
    nll = _nll64(gemma.eval(second, all_logits=True), tokens[n : 2 * n], n // 2)
    gemma.reset()
    assert math.isclose(r.chunk_ppl[1], math.exp(nll.mean()), rel_tol=1e-6)


def test_cli_prints_llama_perplexity_lines(model_path: Path, smol: Engine) -> None:
    args = ["-m", str(model_path), "-f", str(TEXT_PATH), "-c", "128", "--chunks", "2", "-t", "2"]
    r = subprocess.run(
        [sys.executable, "-m", "oxillama", "perplexity", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    ours = smol.perplexity(TEXT, n_ctx=128, chunks=2)
    final = FINAL.search(r.stdout)
    assert final is not None, r.stdout
    assert final.groups() == (f"{ours.ppl:.4f}", f"{ours.ppl_error:.5f}")
    running = "".join(f"[{i}]{v:.4f}," for i, v in enumerate(ours.running_ppl, 1))
    assert running in r.stdout.splitlines()
    assert "tokens/s" in r.stderr


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = cli.main(["perplexity", *args, "-t", "2", "--no-progress"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_kl_divergence_of_a_model_against_itself(
    model_path: Path, smol: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base.kld"
    m = ["-m", str(model_path)]
    saved = _cli(capsys, *m, "-f", str(TEXT_PATH), "-c", "128", "--chunks", "2",
                 "--kl-divergence-base", str(base))  # fmt: skip
    assert FINAL.search(saved) is not None
    # llama.cpp's layout: magic, n_ctx, n_vocab, chunks, the chunks' tokens.
    head = base.read_bytes()[:20]
    assert head[:8] == b"_logits_" and struct.unpack("<Iii", head[8:]) == (128, 49152, 2)

    out = _cli(capsys, *m, "--kl-divergence-base", str(base), "--kl-divergence")
    rows = [line for line in out.splitlines() if re.match(r"^ +[12] +\d", line)]
    assert len(rows) == 2 and "Same top p" in out.splitlines()[0]
    same_top = re.search(r"^Same top p: +([\d.]+) ± +([\d.]+) %$", out, re.M)
    assert same_top is not None and same_top.groups() == ("100.000", "0.000")
    kld = re.search(r"^Mean    KLD: +(-?[\d.]+) ±", out, re.M)
    assert kld is not None and abs(float(kld.group(1))) < 1e-4
    ratio = re.search(r"^Mean PPL\(Q\)/PPL\(base\) +: +([\d.]+) ±", out, re.M)
    assert ratio is not None and abs(float(ratio.group(1)) - 1) < 1e-4

    r = smol.perplexity(kl_base=base, chunks=1)
    assert r.kl is not None and r.kl.count == r.n_tokens == 63
    assert abs(r.kl.kld) < 1e-4 and r.kl.same_top == 1.0
    assert abs(r.kl.ppl / r.kl.ppl_base - 1) < 1e-4 and abs(r.kl.ppl / r.ppl - 1) < 1e-6


def test_a_bad_base_file_is_a_load_error(smol: Engine, tmp_path: Path) -> None:
    bad = tmp_path / "bad.kld"
    bad.write_bytes(b"not a file of logits")
    with pytest.raises(LoadError, match="_logits_"):
        smol.perplexity(kl_base=bad)
    # A well-formed file over a 10-token vocabulary: 1 chunk of 4 tokens, 1 row.
    other = tmp_path / "other.kld"
    other.write_bytes(b"_logits_" + struct.pack("<Iii", 4, 10, 1) + bytes(16 + 2 * 14))
    with pytest.raises(LoadError, match="vocabulary of 10 tokens"):
        smol.perplexity(kl_base=other)
    cut = tmp_path / "cut.kld"
    cut.write_bytes(other.read_bytes()[:-2])
    with pytest.raises(LoadError, match="truncated"):
        smol.perplexity(kl_base=cut)
    with pytest.raises(ParameterError, match="no text"):
        smol.perplexity(TEXT, kl_base=other)


def test_bad_input_is_a_parameter_error(
    smol: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert issubclass(ParameterError, OxiLlamaError)
    with pytest.raises(ParameterError, match="the text is empty"):
        smol.perplexity("")
    with pytest.raises(ParameterError, match=r"tokenizes to \d+ tokens; .* needs at least 1024"):
        smol.perplexity(TEXT[:2000])
    with pytest.raises(ParameterError, match="context_size=1024"):
        smol.perplexity(TEXT, n_ctx=1024)
    with pytest.raises(ParameterError, match="chunks"):
        smol.perplexity(TEXT, chunks=0)
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert cli.main(["perplexity", "-f", str(empty), "-t", "2", "--no-progress"]) == 2
    assert "oxillama: error: the text is empty" in capsys.readouterr().err
