"""``oxillama info``: what a GGUF file holds, from its header alone."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from oxillama.errors import ParameterError
from oxillama.model.hub import add_hf_arg
from oxillama.model.summary import GgufSummary, format_params, format_size, summarize

DESCRIPTION = """\
Show what a GGUF file holds, read from its header (no weights are loaded):
the model as llama.cpp names it, parameter count, size and quantization
mix, hyper-parameters, tokenizer and special tokens, chat template, every
metadata key and, with --tensors, every tensor."""

EPILOG = """\
examples:
  oxillama info ./model.gguf                 summary, tokenizer, metadata
  oxillama info ./model.gguf --tensors       ... and every tensor's type, shape, size
  oxillama info ./model.gguf --template      the chat template, whole
  oxillama info ./model.gguf --json | jq .model.n_params
  oxillama info --hf ggml-org/gemma-3-270m-GGUF
"""

# Arrays longer than this are shown by their length (tokens, merges...).
_SHORT_LIST = 8


def add_parser(sub: Any) -> None:
    i = sub.add_parser(
        "info",
        help="show a GGUF file's model, tokenizer, metadata and tensors",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    i.add_argument("model_path", nargs="?", help="GGUF file (default: the default model)")
    add_hf_arg(i)
    i.add_argument(
        "--tensors", action="store_true", help="list every tensor: name, type, shape, size"
    )
    i.add_argument("--full", action="store_true", help="do not shorten long strings and arrays")
    i.add_argument(
        "--template",
        nargs="?",
        const="default",
        metavar="NAME",
        help="print the chat template whole (or the one named NAME) and nothing else",
    )
    i.add_argument(
        "--json",
        action="store_true",
        help="everything as one JSON object (all tensors included; long arrays "
        "shortened unless --full)",
    )
    i.set_defaults(func=cmd_info)


def _path(args: argparse.Namespace) -> str:
    from oxillama.model.hub import download
    from oxillama.model.paths import resolve_model_path

    if args.hf is not None:
        if args.model_path is not None:
            raise ParameterError("give a model path or --hf, not both")
        repo, _, name = args.hf.partition(":")
        return str(download(repo, name or "*.gguf")[0])
    return str(resolve_model_path(args.model_path))


def cmd_info(args: argparse.Namespace) -> int:
    s = summarize(_path(args))
    if args.template is not None:
        templates = s.chat_templates
        text = templates.get(args.template)
        if text is None:
            have = ", ".join(templates) or "none"
            print(
                f"oxillama: {s.path} has no chat template {args.template!r} (templates: {have})",
                file=sys.stderr,
            )
            return 1
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    if args.json:
        json.dump(as_json(s, full=args.full), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(render(s, tensors=args.tensors, full=args.full))
    return 0


# ------------------------------------------------------------------ text


def _num(v: Any) -> str:
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:g}"
    if isinstance(v, list):
        return "per layer " + ",".join(_num(x) for x in v)
    return str(v)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _meta_value(v: Any, full: bool) -> str:
    if isinstance(v, list):
        return f"[{len(v)} items]" if len(v) > _SHORT_LIST and not full else repr(v)
    if isinstance(v, str) and len(v) > 80 and not full:
        return repr(v[:77] + "...")
    return repr(v)


def render(s: GgufSummary, *, tensors: bool = False, full: bool = False) -> str:
    """The text ``oxillama info`` prints."""
    out: list[str] = []
    w = out.append
    meta = s.metadata
    w(f"file:          {s.path}")
    w(
        f"               {format_size(s.file_size)}, GGUF v{s.version}, alignment {s.alignment}, "
        f"header parsed in {s.parse_seconds * 1e3:.1f} ms"
    )
    named = [f"general.name {s.name!r}"] if s.name else []
    label = meta.get("general.size_label")
    if isinstance(label, str):
        named.append(f"size label {label}")
    w(f"model:         {s.description}" + (f"  ({', '.join(named)})" if named else ""))
    w(f"parameters:    {format_params(s.n_params)} ({s.n_params:,})")
    w(f"tensor data:   {format_size(s.n_bytes)}, {s.bits_per_weight:.2f} bits per weight")
    ft = meta.get("general.file_type")
    w(f"file type:     {s.file_type}" + (f" (general.file_type {ft})" if ft is not None else ""))

    h = s.hparams
    w(f"architecture:  {s.arch}")
    rows: list[tuple[str, Any]] = [
        ("context length", h.get("context_length")),
        ("layers", h.get("n_layer")),
        ("embedding", h.get("n_embd")),
        ("feed-forward", h.get("n_ff")),
        ("heads", h.get("n_head")),
        ("KV heads", h.get("n_head_kv")),
    ]
    if "head_dim_k" in h:
        k, v = h["head_dim_k"], h["head_dim_v"]
        rows.append(("head dim", _num(k) if k == v else f"{_num(k)} (K), {_num(v)} (V)"))
    kv = h.get("n_head_kv")
    if isinstance(kv, list) and 0 in kv:
        # A hybrid: llama.cpp's per-layer KV head count of 0 marks a layer
        # without attention (a convolution or Mamba-2 layer).
        recr = [str(i) for i, n in enumerate(kv) if n == 0]
        rows.append(
            (
                "layer kinds",
                f"{len(kv) - len(recr)} attention, {len(recr)} recurrent ({','.join(recr)})",
            )
        )
    n_shared, n_layer = h.get("shared_kv_layers"), h.get("n_layer")
    if isinstance(n_shared, int) and isinstance(n_layer, int) and 0 < n_shared < n_layer:
        # Gemma-3n: the last layers attend over earlier layers' keys and
        # values and keep none of their own.
        rows.append(
            (
                "KV cache",
                f"{n_layer - n_shared} of {n_layer} layers (layers "
                f"{n_layer - n_shared}-{n_layer - 1} reuse earlier layers' keys and values)",
            )
        )
    if "altup_num_inputs" in h:
        rows.append(
            (
                "AltUp",
                f"{h['altup_num_inputs']} streams, per-layer inputs "
                f"{_num(h.get('n_embd_per_layer', '?'))} wide",
            )
        )
    if "kv_lora_rank" in h:
        q = h.get("q_lora_rank")
        rows.append(
            (
                "MLA",
                f"kv_lora_rank {h['kv_lora_rank']}, "
                + (f"q_lora_rank {q}, " if q else "direct q, ")
                + f"heads {h.get('head_dim_k_mla', '?')} (K), {h.get('head_dim_v_mla', '?')} (V)",
            )
        )
    per_token = s.kv_values_per_token()
    if per_token is not None:
        n, how = per_token
        rows.append(("KV per token", f"{n * 2:,} bytes in f16 ({n:,} values: {how})"))
    if "n_expert" in h:
        shared = f", shared expert {_num(h['n_ff_shexp'])} wide" if h.get("n_ff_shexp") else ""
        rows.append(("experts", f"{h['n_expert']} ({h.get('n_expert_used', '?')} used){shared}"))
    if "ssm_d_inner" in h:
        ssm = (
            f"inner {_num(h['ssm_d_inner'])}, state {_num(h.get('ssm_d_state', '?'))}, "
            f"conv kernel {_num(h.get('ssm_d_conv', '?'))}"
        )
        if s.arch == "jamba":
            # Mamba-1's time step rank is the low-rank width of its step
            # projection (Mamba-2's is its head count).
            ssm += f", time step rank {_num(h.get('ssm_dt_rank', '?'))} (Mamba-1)"
        rows.append(("ssm", ssm))
    if "shortconv_l_cache" in h:
        rows.append(("short conv", f"kernel {_num(h['shortconv_l_cache'])}"))
    if "rope_freq_base" in h or "rope_dims" in h:
        rope = [f"freq base {_num(h['rope_freq_base'])}"] if "rope_freq_base" in h else []
        if "rope_freq_base_swa" in h:
            rope.append(f"sliding-window layers {_num(h['rope_freq_base_swa'])}")
        if "rope_dims" in h:
            rope.append(f"{h['rope_dims']} dims")
        if "rope_scaling" in h:
            factor = h.get("rope_scaling_factor")
            rope.append(f"scaling {h['rope_scaling']}" + (f" x{_num(factor)}" if factor else ""))
        rows.append(("rope", ", ".join(rope)))
    if s.arch == "jamba":
        # llama.cpp's Jamba graph rotates nothing, whatever the file says.
        rows.append(("rope", "none (Jamba's attention has no positional encoding)"))
    if s.arch == "granitehybrid" and h.get("rope_finetuned") is False:
        # llama.cpp reads Granite-4.0-H's rope.scaling.finetuned as the
        # switch for RoPE: false is no positional encoding at all.
        rows.append(("rope", "none (rope.scaling.finetuned false)"))
    rows += [
        ("rms norm eps", h.get("norm_rms_eps")),
        ("norm eps", h.get("norm_eps")),
        ("sliding window", h.get("sliding_window")),
        ("vocabulary", h.get("n_vocab")),
    ]
    for name, value in rows:
        if value is not None:
            w(f"  {name:15s} {_num(value)}")

    tok = s.tokenizer
    w(
        f"tokenizer:     {tok.model or '-'}, pre-tokenizer {tok.pre or '-'}, "
        f"{tok.vocab_size} tokens, add_bos {tok.add_bos}, add_eos {tok.add_eos}"
    )
    if tok.error:
        w(f"  (as the file says: {tok.error})")
    for slot, (tid, text) in tok.special.items():
        w(f"  {slot.upper():4s} {tid:<7d} {text!r}")
    if tok.eog:
        w("  end of generation: " + ", ".join(str(t) for t in tok.eog))

    templates = s.chat_templates
    if not templates:
        w("chat template: none (oxillama falls back to ChatML)")
    for name, text in templates.items():
        lines = text.splitlines()
        which = "" if name == "default" else f" {name!r}"
        w(
            f"chat template{which}: {len(text)} characters, {len(lines)} lines "
            f"(--template{'' if name == 'default' else ' ' + name} prints it whole)"
        )
        for line in lines[: len(lines) if full else 4]:
            w("  | " + (line if full or len(line) <= 100 else line[:97] + "..."))
        if not full and len(lines) > 4:
            w("  | ...")

    w(f"metadata:      {len(meta)} keys")
    for k, v in meta.items():
        w(f"  {k} = {_meta_value(v, full)}")

    w(f"tensors:       {len(s.tensors)}" + ("" if tensors else " (--tensors lists them)"))
    for ty, count, elements, nbytes in s.type_mix():
        w(
            f"  {ty:7s} x{count:<5d} {format_size(nbytes):>12s}  "
            f"{100.0 * nbytes / max(s.n_bytes, 1):5.1f}% of bytes, "
            f"{100.0 * elements / max(s.n_params, 1):5.1f}% of parameters"
        )
    if tensors:
        width = max((len(t.name) for t in s.tensors), default=4)
        shapes = [_shape(t.shape) for t in s.tensors]
        sw = max((len(x) for x in shapes), default=5)
        w("")
        w(
            f"  {'#':>4s}  {'name':{width}s}  {'type':7s}  {'shape':{sw}s}  {'params':>12s}  "
            f"{'size':>12s}  {'offset':>12s}"
        )
        for i, (t, shape) in enumerate(zip(s.tensors, shapes, strict=True)):
            w(
                f"  {i:4d}  {t.name:{width}s}  {t.type:7s}  {shape:{sw}s}  {t.n_elements:12d}  "
                f"{format_size(t.n_bytes):>12s}  {t.offset:#12x}"
            )
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ JSON


def _json_safe(v: Any, full: bool) -> Any:
    """Metadata values as strict JSON: non-finite floats become strings and
    long arrays their length and first items (unless ``full``)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list):
        if len(v) > _SHORT_LIST and not full:
            return {"array_length": len(v), "first": [_json_safe(x, full) for x in v[:_SHORT_LIST]]}
        return [_json_safe(x, full) for x in v]
    return v


def as_json(s: GgufSummary, *, full: bool = False) -> dict[str, Any]:
    """Everything ``render`` shows, as one JSON-ready object."""
    tok = s.tokenizer
    ft = s.metadata.get("general.file_type")
    return {
        "file": {
            "path": s.path,
            "size": s.file_size,
            "gguf_version": s.version,
            "alignment": s.alignment,
        },
        "model": {
            "architecture": s.arch,
            "description": s.description,
            "name": s.name,
            "size_label": s.size_label,
            "n_params": s.n_params,
            "n_bytes": s.n_bytes,
            "bits_per_weight": s.bits_per_weight,
            "file_type": s.file_type,
            "file_type_id": ft,
        },
        "hparams": {k: _json_safe(v, True) for k, v in s.hparams.items()},
        "type_mix": [
            {"type": ty, "tensors": c, "n_params": e, "n_bytes": b} for ty, c, e, b in s.type_mix()
        ],
        "tokenizer": {
            "model": tok.model,
            "pre": tok.pre,
            "vocab_size": tok.vocab_size,
            "special": {k: {"id": i, "text": t} for k, (i, t) in tok.special.items()},
            "add_bos": tok.add_bos,
            "add_eos": tok.add_eos,
            "eog": list(tok.eog),
            "error": tok.error,
        },
        "chat_templates": s.chat_templates,
        "metadata": {k: _json_safe(v, full) for k, v in s.metadata.items()},
        "tensors": [
            {
                "name": t.name,
                "type": t.type,
                "shape": list(t.shape),
                "n_params": t.n_elements,
                "n_bytes": t.n_bytes,
                "offset": t.offset,
            }
            for t in s.tensors
        ],
    }
