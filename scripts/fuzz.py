"""Fuzz oxillama's input readers and count what happens, per target.

    python scripts/fuzz.py TARGET --inputs N      # or --seconds S
    python scripts/fuzz.py all --inputs 2000 --json
    python scripts/fuzz.py --replay tests/corpus/gguf-bytes/crash-<sha1>

Targets: gguf-bytes, gguf-file, oxisnap, oxispec (binary, atheris),
gbnf, json-schema, template, tokenizer, http (hypothesis strategies driven
by atheris; http by schemathesis). Per target it prints the inputs run,
typed errors (`OxiLlamaError`), crashes (a signal, an abort, an exit, a
Rust panic, which users see as `InternalError`, or any other exception
reaching Python), hangs (one input over 2 s) and the peak RSS of the fuzzed
processes.

The inputs run in a worker process this driver supervises: a crash or a
hang ends only the worker, which is restarted with the corpus it had
grown, and the input is kept as ``tests/corpus/<target>/crash-<sha1>`` or
``hang-<sha1>`` (the regression tests replay every such file).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path[:0] = [str(SCRIPTS), str(ROOT)]

from fuzz_targets import NAMES, load  # noqa: E402
from fuzz_targets.worker import CRASH, CRASH_INPUT, DONE, RAW_NAME, START, TYPED  # noqa: E402

HANG_SECONDS = 2.0
SETUP_SECONDS = 300.0
CORPUS = ROOT / "tests" / "corpus"


@dataclasses.dataclass
class Result:
    target: str
    inputs: int = 0
    typed_errors: int = 0
    crashes: int = 0
    hangs: int = 0
    peak_rss_mib: float = 0.0
    seconds: float = 0.0
    restarts: int = 0
    # The slowest input that finished, in seconds (poll-granular, 0.1 s):
    # how far the target is from the hang bound.
    slowest_seconds: float = 0.0
    typed_by_class: dict[str, int] = dataclasses.field(default_factory=dict)
    saved: list[str] = dataclasses.field(default_factory=list)
    crash_reports: list[str] = dataclasses.field(default_factory=list)


class Worker:
    """One worker process (and its process group: a server it started)."""

    def __init__(self, name: str, run_dir: Path, seed: int) -> None:
        self.input_path = run_dir / "current-input"
        self.log_path = run_dir / "worker.log"
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), str(ROOT)]))
        env.setdefault("RUST_BACKTRACE", "0")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    # As a module: the script's own folder on sys.path
                    # would shadow standard modules (http, ...).
                    "-m",
                    "fuzz_targets.worker",
                    name,
                    str(write_fd),
                    str(self.input_path),
                    str(run_dir / "corpus"),
                    str(run_dir / "work"),
                    str(seed),
                ],
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                cwd=run_dir,
                start_new_session=True,
            )
        os.close(write_fd)
        self.pipe = read_fd
        self.buffer = b""
        self.started = time.monotonic()

    def records(self, timeout: float) -> list[tuple[bytes, int, int | bytes]] | None:
        """Whole records that arrived within `timeout`; None at end of file."""
        ready, _, _ = select.select([self.pipe], [], [], timeout)
        if ready:
            chunk = os.read(self.pipe, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        out: list[tuple[bytes, int, int | bytes]] = []
        while self.buffer:
            kind = self.buffer[:1]
            if kind == b"S" and len(self.buffer) >= START.size:
                _, n, raw = START.unpack_from(self.buffer)
                out.append((kind, n, raw))
                self.buffer = self.buffer[START.size :]
            elif kind == b"D" and len(self.buffer) >= DONE.size:
                _, outcome, n = DONE.unpack_from(self.buffer)
                if len(self.buffer) < DONE.size + n:
                    break
                out.append((kind, outcome, self.buffer[DONE.size : DONE.size + n]))
                self.buffer = self.buffer[DONE.size + n :]
            else:
                break
        return out

    def current_input(self, length: int) -> bytes:
        with self.input_path.open("rb") as f:
            return f.read(length)

    def forget_current(self, raw_length: int) -> None:
        """Removes the input being run from the corpus, where a seed or an
        earlier find can sit: a restarted worker replays its corpus first
        and would meet the same hang or crash again, forever."""
        with self.input_path.with_name(RAW_NAME).open("rb") as f:
            raw = f.read(raw_length)
        for p in (self.input_path.parent / "corpus").iterdir():
            if p.stat().st_size == raw_length and p.read_bytes() == raw:
                p.unlink()

    def peak_rss_kib(self) -> int:
        """The largest VmHWM among the worker's process group."""
        peak = 0
        for pid in _group_members(self.proc.pid):
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        return peak

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        os.close(self.pipe)

    def log_tail(self, n: int = 30) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines[-n:])


def _group_members(pgid: int) -> list[int]:
    members = [pgid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != pgid:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    members.append(int(entry.name))
    return members


def _signature(report: str) -> str:
    """A traceback's innermost frame and exception type."""
    lines = [line for line in report.strip().splitlines() if line.strip()]
    frames = [line.strip() for line in lines if line.lstrip().startswith('File "')]
    kind = lines[-1].split(":", 1)[0] if lines else ""
    return f"{frames[-1] if frames else ''} {kind}"


def _death(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def _keep(result: Result, corpus_root: Path, kind: str, data: bytes) -> Path:
    """Writes a failing input under its content's name and lists it in
    ``result.saved`` (once per content)."""
    corpus_dir = corpus_root / result.target
    corpus_dir.mkdir(parents=True, exist_ok=True)
    path = corpus_dir / f"{kind}-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    if str(path) not in result.saved:
        result.saved.append(str(path))
    return path


def fuzz(
    name: str,
    *,
    inputs: int | None,
    seconds: float | None,
    seed: int = 1,
    corpus_root: Path = CORPUS,
    verbose: bool = False,
) -> Result:
    result = Result(name)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"oxillama-fuzz-{name}-") as tmp:
        run_dir = Path(tmp)
        (run_dir / "work").mkdir()
        while True:
            worker = Worker(name, run_dir, seed + result.restarts)
            try:
                done = _supervise(worker, result, inputs, seconds, start, corpus_root, verbose)
            finally:
                result.peak_rss_mib = max(result.peak_rss_mib, worker.peak_rss_kib() / 1024)
                worker.kill()
            if done:
                break
            result.restarts += 1
    result.peak_rss_mib = round(result.peak_rss_mib, 1)
    result.seconds = round(time.monotonic() - start, 1)
    return result


def _supervise(
    worker: Worker,
    result: Result,
    inputs: int | None,
    seconds: float | None,
    start: float,
    corpus_root: Path,
    verbose: bool,
) -> bool:
    """Runs one worker until the budget is spent (True) or it died or hung
    on an input (False: restart it)."""
    by_class = Counter(result.typed_by_class)
    signatures = {_signature(r) for r in result.crash_reports}
    running: tuple[float, int, int] | None = None  # (since, input and raw lengths)
    seen_input = False
    last_rss = 0.0

    def finished() -> bool:
        over_inputs = inputs is not None and result.inputs >= inputs
        over_time = seconds is not None and time.monotonic() - start >= seconds
        return over_inputs or over_time

    try:
        while not finished():
            records = worker.records(0.1)
            now = time.monotonic()
            if now - last_rss > 0.5:
                result.peak_rss_mib = max(result.peak_rss_mib, worker.peak_rss_kib() / 1024)
                last_rss = now
            if records is None:
                code = worker.proc.wait()
                if running is None:
                    if not seen_input:
                        raise RuntimeError(
                            f"the {result.target} worker {_death(code)} before its first "
                            f"input:\n{worker.log_tail()}"
                        )
                    # libFuzzer ends between inputs only when told to stop.
                    raise RuntimeError(
                        f"the {result.target} worker {_death(code)} between inputs:\n"
                        f"{worker.log_tail()}"
                    )
                data = worker.current_input(running[1])
                worker.forget_current(running[2])
                result.inputs += 1
                result.crashes += 1
                saved = _keep(result, corpus_root, "crash", data)
                result.crash_reports.append(f"{_death(code)}:\n{worker.log_tail()}")
                if verbose:
                    print(f"crash ({_death(code)}): kept {saved}", file=sys.stderr)
                return False
            for kind, value, message in records:
                if kind == b"S":
                    assert isinstance(message, int)
                    running = (now, value, message)
                    seen_input = True
                    continue
                assert running is not None
                result.inputs += 1
                result.slowest_seconds = max(result.slowest_seconds, round(now - running[0], 2))
                if value == TYPED:
                    assert isinstance(message, bytes)
                    by_class[message.decode()] += 1
                    result.typed_errors += 1
                elif value == CRASH:
                    result.crashes += 1
                    assert isinstance(message, bytes)
                    (n,) = CRASH_INPUT.unpack_from(message)
                    data = message[CRASH_INPUT.size : CRASH_INPUT.size + n]
                    report = message[CRASH_INPUT.size + n :].decode(errors="replace")
                    # One kept input per distinct failure (where it was
                    # raised, and what): a fuzzer repeats a bug thousands
                    # of times.
                    where = _signature(report)
                    if where not in signatures:
                        signatures.add(where)
                        saved = _keep(result, corpus_root, "crash", data)
                        result.crash_reports.append(report)
                        if verbose:
                            print(f"crash: kept {saved}\n{report}", file=sys.stderr)
                running = None
                if finished():
                    return True
            if running is not None and now - running[0] > HANG_SECONDS:
                data = worker.current_input(running[1])
                worker.forget_current(running[2])
                result.inputs += 1
                result.hangs += 1
                saved = _keep(result, corpus_root, "hang", data)
                if verbose:
                    print(f"hang: kept {saved}", file=sys.stderr)
                return False
            if not seen_input and now - worker.started > SETUP_SECONDS:
                raise RuntimeError(
                    f"the {result.target} worker did not start:\n{worker.log_tail()}"
                )
        return True
    finally:
        result.typed_by_class = dict(by_class)


def replay(path: Path) -> str:
    """Runs one kept input in this process: 'ok <seconds>' or 'typed
    <Class> <seconds>' (a crash raises)."""
    from oxillama import OxiLlamaError

    target = load(path.parent.name)
    with tempfile.TemporaryDirectory(prefix="oxillama-replay-") as tmp:
        target.setup(Path(tmp))
        value = target.decode(path.read_bytes())
        start = time.perf_counter()
        outcome = "ok"
        try:
            target.run(value)
        except OxiLlamaError as e:
            outcome = f"typed {type(e).__name__}"
        finally:
            target.close()
    return f"{outcome} {time.perf_counter() - start:.3f}"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def table(results: list[Result]) -> str:
    rows = [("target", "inputs", "typed errors", "crashes", "hangs", "peak RSS", "time")]
    for r in results:
        rows.append(
            (
                r.target,
                f"{r.inputs:,}",
                f"{r.typed_errors:,}",
                f"{r.crashes:,}",
                f"{r.hangs:,}",
                f"{r.peak_rss_mib:,.0f} MiB",
                f"{r.seconds:,.0f} s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("target", nargs="?", help=f"one of: all, {', '.join(NAMES)}")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--inputs", type=int, help="inputs to run per target")
    budget.add_argument("--seconds", type=float, help="seconds to run per target")
    p.add_argument("--seed", type=int, default=1, help="fuzzer seed (default 1)")
    p.add_argument("--corpus", type=Path, default=CORPUS, help="where crashes and hangs go")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--replay", type=Path, help="run one kept input and print its outcome")
    p.add_argument(
        "--hang-seconds",
        type=float,
        default=HANG_SECONDS,
        help=f"one input over this is a hang (default {HANG_SECONDS:g}); lower it to keep "
        "the slow inputs that approach the bound",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    globals()["HANG_SECONDS"] = a.hang_seconds
    if a.replay is not None:
        print(replay(a.replay))
        return 0
    if a.target is None:
        p.error("a target is required")
    if a.inputs is None and a.seconds is None:
        p.error("give --inputs N or --seconds S")
    names = list(NAMES) if a.target == "all" else [a.target]
    results = []
    for name in names:
        load(name)  # an unknown name fails before any work
        r = fuzz(
            name,
            inputs=a.inputs,
            seconds=a.seconds,
            seed=a.seed,
            corpus_root=a.corpus,
            verbose=a.verbose,
        )
        results.append(r)
        if not a.json:
            print(table([r]).splitlines()[-1] if len(results) > 1 else table([r]), flush=True)
    if a.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    else:
        print(f"\n{cpu_model()}, {os.cpu_count()} logical CPUs")
    return 1 if any(r.crashes or r.hangs for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
