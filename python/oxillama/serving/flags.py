"""``oxillama serve``: its flags, and the server (or Ray Serve deployment)
they describe. ``serve run oxillama.serving.ray:app key=value ...`` reads
the same flags (:func:`serve_options_from_mapping`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from oxillama.engine.kv_types import KV_TYPES
from oxillama.errors import ParameterError
from oxillama.model.hub import add_hf_arg

__all__ = ["add_serve_parser", "app_spec", "ray_options", "serve_options_from_mapping"]

DESCRIPTION = (
    "Serve the model over an OpenAI-compatible API (/v1/completions, "
    "/v1/chat/completions, /v1/responses, /v1/models, /health, /ready, /metrics). Concurrent "
    'requests are batched. A request with "session": "<id>" (or the header '
    "X-Session-Id: <id>) continues that session's context: its KV stays in the shared "
    "pool between turns and its turns batch with everything else. GET /openapi.json "
    "describes every route. With --ray, Ray Serve runs --replicas copies and routes each "
    "session to the replica that holds it. Needs: pip install 'oxillama[server]' "
    "(and 'oxillama[ray]' for --ray)."
)


def add_serve_parser(sub: Any, command: Callable[[argparse.Namespace], int]) -> None:
    """``oxillama serve``, run by ``command``."""
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server", description=DESCRIPTION)
    _add_serve_args(sv)
    sv.set_defaults(func=command)


def _add_serve_args(sv: argparse.ArgumentParser) -> None:
    sv.add_argument("--model", "-m", help="GGUF file (default: SmolLM2-135M-Instruct)")
    add_hf_arg(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    sv.add_argument(
        "--threads",
        "-t",
        type=int,
        help="worker threads (default: the physical cores this process may use: "
        "affinity and cgroup quota)",
    )
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
    for side, what in (("k", "keys"), ("v", "values")):
        sv.add_argument(
            f"--cache-type-{side}",
            choices=KV_TYPES,
            default="f16",
            help=f"KV cache type of the {what}, as llama.cpp's (default: f16); q8_0 and q4_0 "
            "hold ggml's blocks (about 0.53x and 0.28x of f16's memory)",
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
    sv.add_argument(
        "--context-shift",
        action="store_true",
        help="when a session turn or a one-shot request fills its context, keep the first "
        "--keep tokens, drop half of the rest and go on, as llama.cpp's --context-shift "
        "(default: off, the generation ends with finish_reason 'length'); refused for "
        "recurrent models",
    )
    sv.add_argument(
        "--keep",
        type=int,
        default=0,
        metavar="N",
        help="tokens a context shift keeps at the start of the context (default: 0)",
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
        "--reasoning-format",
        choices=["auto", "deepseek", "none"],
        default="auto",
        help="where a thinking model's <think>...</think> goes: 'auto' (default) splits it into "
        "message.reasoning_content when the model has the markers (a <think> token or a "
        "template that writes it), 'deepseek' always splits, 'none' leaves it in the content",
    )
    sv.add_argument(
        "--reasoning-budget",
        type=int,
        choices=[-1, 0],
        default=-1,
        help="-1 (default): think freely; 0: thinking off where the template has the switch "
        "(it gets enable_thinking=false unless a request's chat_template_kwargs says otherwise)",
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
        "--no-webui",
        dest="webui",
        action="store_false",
        help="do not serve the chat page at / (the API is served either way)",
    )
    sv.add_argument(
        "--kv-store",
        action="append",
        metavar="DIR|redis://HOST:PORT/DB",
        help="a tier of the prefix store below the in-memory prefix cache, repeatable, tiers "
        "in order: a folder (created if missing; survives restarts) or a Redis every replica "
        "and process shares. A finished request's KV is kept there in blocks of 256 tokens; "
        "a prompt that begins with stored blocks restores them and prefills only the rest "
        "(same output). A corrupt block or a failing tier is a miss, counted on /metrics "
        "(oxillama:kv_store_*_total{tier=...})",
    )
    sv.add_argument(
        "--kv-store-bytes",
        type=_size_arg(),
        metavar="N",
        help="bound on the --kv-store folder's bytes (e.g. 20G); the least recently used "
        "blocks are deleted first (default: unbounded)",
    )
    sv.add_argument(
        "--reranking",
        action="store_true",
        help="serve POST /v1/rerank (and /rerank) in llama-server's shape; the model must be "
        "a reranker (a cross-encoder: a BERT GGUF with a classifier head)",
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
    _add_ray_args(sv)


def app_spec(args: argparse.Namespace) -> Any:
    """The :class:`~oxillama.serving.http.app_spec.AppSpec` the flags describe
    (``oxillama serve`` runs it; see ``cli.cmd_serve``)."""
    from oxillama.model.offload import Budget
    from oxillama.serving.http import Limits
    from oxillama.serving.http.app_spec import AppSpec

    if args.hf is not None and args.model is not None:
        raise ParameterError("give --model or --hf, not both")
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth,
        max_prompt_chars=args.max_prompt_chars,
        max_stop=args.max_stop,
        max_stop_chars=args.max_stop_chars,
        max_logit_bias=args.max_logit_bias,
        max_sessions=args.max_sessions,
        max_session_memory=args.max_session_memory,
        persist_turns=args.persist_turns,
    )
    return AppSpec(
        args.model,
        hf=args.hf,
        threads=args.threads,
        context_size=args.context_size,
        max_batch=args.max_batch,
        kv_pages=args.kv_pages,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
        max_queue=args.max_queue,
        offload=Budget(args.offload_budget, evict=args.offload_evict)
        if args.offload_budget is not None
        else None,
        model_name=args.model_name,
        sessions_dir=args.sessions_dir,
        api_keys=tuple(args.api_key or ()),
        api_key_file=args.api_key_file,
        metrics_auth=args.metrics_auth,
        limits=limits,
        loras=_lora_args(args.lora or []) or None,
        tool_format=args.tool_format,
        reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget,
        speculative=args.speculative,
        context_shift=args.context_shift,
        n_keep=args.keep,
        webui=args.webui,
        kv_store=tuple(args.kv_store or ()),
        kv_store_bytes=args.kv_store_bytes,
        reranking=args.reranking,
    )


def ray_options(args: argparse.Namespace) -> Any:
    from oxillama.serving.ray.options import RayOptions

    return RayOptions(
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_ongoing_requests=args.target_ongoing_requests,
        max_ongoing_requests=args.max_ongoing_requests,
        replica_cpus=args.replica_cpus,
        drain_seconds=args.drain_seconds,
        metrics_targets_dir=args.metrics_targets_dir,
    )


def serve_options_from_mapping(values: Mapping[str, Any]) -> tuple[Any, Any]:
    """``serve run``'s ``key=value`` arguments (or a config file's
    ``args:``) read as ``oxillama serve`` flags: ``model=x.gguf`` is
    ``--model x.gguf``, ``persist_turns=true`` is ``--persist-turns``,
    a list is a repeated flag. Returns (AppSpec, RayOptions)."""
    p = argparse.ArgumentParser(prog="oxillama.serving.ray:app", add_help=False)
    _add_serve_args(p)

    def refuse(message: str) -> NoReturn:
        raise ParameterError(f"oxillama.serving.ray:app: {message}")

    p.error = refuse  # type: ignore[method-assign]
    flags = {a.dest: a for a in p._actions}
    argv: list[str] = []
    for key, value in values.items():
        dest = str(key).replace("-", "_")
        action = flags.get(dest)
        if action is None or not action.option_strings or dest in ("ray", "host", "port"):
            refuse(f"unknown argument {key!r}")
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            if _truth(key, value):
                argv.append(flag)
            continue
        if isinstance(action, argparse._StoreFalseAction):
            # webui=false is --no-webui.
            if not _truth(key, value):
                argv.append(flag)
            continue
        for v in value if isinstance(value, list | tuple) else [value]:
            argv += [flag, str(v)]
    args = p.parse_args(argv)
    return app_spec(args), ray_options(args)


def _truth(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ParameterError(f"oxillama.serving.ray:app: {key} takes true or false, got {value!r}")


def _add_ray_args(sv: argparse.ArgumentParser) -> None:
    r = sv.add_argument_group(
        "Ray Serve",
        "With --ray, Ray Serve runs the replicas (pip install 'oxillama[ray]'): each "
        "replica is this server with its own engine; a request naming a session goes to "
        "the replica holding it, others to the least loaded. --sessions-dir is required "
        "and must be shared by every replica (a shared volume on a cluster): every session "
        "turn ends with its snapshot there, so a lost replica's sessions continue exactly "
        "on another.",
    )
    r.add_argument("--ray", action="store_true", help="run on Ray Serve")
    r.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join (default: $RAY_ADDRESS, else a local one is started)",
    )
    r.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas (default: 1)")
    r.add_argument(
        "--min-replicas", type=int, metavar="N", help="autoscaling: fewest replicas (default: 0)"
    )
    r.add_argument(
        "--max-replicas", type=int, metavar="N", help="autoscaling: most replicas (turns it on)"
    )
    r.add_argument(
        "--target-ongoing-requests",
        type=float,
        metavar="N",
        help="autoscaling: requests per replica it aims for (default: Ray Serve's)",
    )
    r.add_argument(
        "--max-ongoing-requests",
        type=int,
        metavar="N",
        help="requests one replica takes at once; the router holds the rest "
        "(default: twice --max-batch)",
    )
    r.add_argument(
        "--replica-cpus",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs Ray reserves per replica, and its threads unless --threads (default: 1)",
    )
    r.add_argument(
        "--metrics-targets-dir",
        metavar="DIR",
        help="each replica serves its own /metrics on a port of its own and writes a "
        "Prometheus file_sd target file here (default: SESSIONS_DIR/metrics-targets)",
    )


def _size_arg() -> Callable[[str], int]:
    """An argparse ``type`` reading a size (see :func:`parse_size`); its
    error message is the one argparse prints after the flag's name."""

    def parse(text: str) -> int:
        # Here, not at the top: the parser is built without the server extra.
        from oxillama.serving.http.limits import parse_size

        try:
            return parse_size(text)
        except ParameterError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


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
        help="live stateful sessions (stored /v1/responses included); past it the least "
        "recently used idle one is "
        "hibernated to --sessions-dir, or without one evicted (its next request gets a 404 "
        "saying why); 503 with Retry-After when all are in a turn (default: 64)",
    )
    lim.add_argument(
        "--max-session-memory",
        type=_size_arg(),
        metavar="SIZE",
        help="KV cache bytes live stateful sessions may hold together (512M, 2G, or bytes; "
        "binary units); past it the least recently used idle sessions leave memory as past "
        "--max-sessions, and both bounds hold. A smaller --cache-type-k/-v (q8_0, q4_0) fits "
        "more sessions in the same size. A session in a turn stays live whatever its size "
        "(default: no bound)",
    )
