"""``oxillama chat``: a conversation in the terminal, with slash commands
as ``ollama run`` has, line editing and history (readline), multi-line
input between ``\"\"\"`` lines, and sessions saved, loaded and forked
exactly (the snapshot holds the KV and the sampler's state; the
conversation's messages go beside it, in ``PATH.chat.json``)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from oxillama.decoding.reasoning import HarmonyParser, speaks_harmony
from oxillama.errors import OxiLlamaError

__all__ = ["HELP", "ChatRepl"]

HELP = """\
Commands:
  /help              this text
  /set KEY VALUE     a sampler setting: temperature, top_p, top_k, min_p,
                     repetition_penalty, seed, max_tokens
  /set system TEXT   a new system prompt (starts the conversation over)
  /show              the model, context use and sampler settings
  /save PATH         save the session (PATH and PATH.chat.json)
  /load PATH         continue a saved session exactly where it stopped
  /fork [NAME]       keep this point as a branch and go on from it
  /switch NAME       go back to a branch kept by /fork
  /clear             start the conversation over
  /bye               quit (also Ctrl-D)
Start and end a multi-line message with a line of three quotes (\"\"\").
"""

_FLOATS = {"temperature", "top_p", "min_p", "repetition_penalty"}
_INTS = {"top_k", "seed"}


@dataclasses.dataclass
class _Branch:
    snapshot: bytes
    messages: list[dict[str, str]]


class ChatRepl:
    """The loop of ``oxillama chat`` over ``engine``, reading with ``read``
    (``input`` by default) and writing to ``out``."""

    def __init__(
        self,
        engine: Any,
        *,
        system: str | None,
        max_tokens: int,
        read: Callable[[str], str] = input,
        out: TextIO = sys.stdout,
        interactive: bool = False,
    ) -> None:
        self.engine = engine
        self.system = system
        self.max_tokens = max_tokens
        self.read, self.out, self.interactive = read, out, interactive
        self.messages: list[dict[str, str]] = self._start()
        self.branches: dict[str, _Branch] = {}

    def _start(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def run(self) -> int:
        while True:
            try:
                line = self.read(">>> " if self.interactive else "")
            except (EOFError, KeyboardInterrupt):
                self._say("")
                return 0
            if line.strip() == '"""':
                block = self._multiline()
                if block is None:
                    return 0
                line = block
            elif not line.strip():
                continue
            elif line.startswith("/"):
                try:
                    if self.command(line.strip()) == "bye":
                        return 0
                except (OxiLlamaError, OSError, ValueError) as e:
                    self._say(f"error: {e}")
                continue
            self.reply(line)

    def _multiline(self) -> str | None:
        lines: list[str] = []
        while True:
            try:
                part = self.read("... " if self.interactive else "")
            except (EOFError, KeyboardInterrupt):
                return None
            if part.strip() == '"""':
                return "\n".join(lines)
            lines.append(part)

    def reply(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})
        # A harmony model (gpt-oss) shows and keeps its final answer only:
        # its analysis and the channel markers are not for the terminal,
        # and its template wants the answer alone back in the history.
        harmony = HarmonyParser() if speaks_harmony(self.engine.chat_template_source) else None
        shown = []
        for piece in self.engine.chat_stream(self.messages, self.max_tokens):
            if harmony is not None:
                piece = harmony.feed(piece).content
            shown.append(piece)
            self.out.write(piece)
            self.out.flush()
        if harmony is not None:
            shown.append(harmony.finish().content)
            self.out.write(shown[-1])
        self._say("")
        self.messages.append({"role": "assistant", "content": "".join(shown)})

    def command(self, line: str) -> str | None:
        """Runs one slash command; ``"bye"`` ends the loop."""
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/bye", "/exit", "/quit"):
            return "bye"
        if name in ("/help", "/?"):
            self.out.write(HELP)
        elif name == "/clear":
            self.engine.reset()
            self.messages = self._start()
            self._say("Cleared.")
        elif name == "/set":
            self._set(rest)
        elif name == "/show":
            self._show()
        elif name == "/save":
            path = self._path(rest)
            self.engine.snapshot(path)
            _side(path).write_text(json.dumps({"messages": self.messages}), encoding="utf-8")
            self._say(f"Saved {len(self.engine.tokens)} tokens to {path}.")
        elif name == "/load":
            path = self._path(rest)
            side = json.loads(_side(path).read_text(encoding="utf-8"))
            self.engine.load_snapshot(path)
            self.messages = list(side["messages"])
            self._say(f"Loaded {len(self.engine.tokens)} tokens from {path}.")
        elif name == "/fork":
            label = rest or str(len(self.branches) + 1)
            self.branches[label] = _Branch(self.engine.snapshot_bytes(), list(self.messages))
            self._say(f"Branch {label!r} kept; /switch {label} comes back to it.")
        elif name == "/switch":
            if rest not in self.branches:
                raise ValueError(f"no branch {rest!r} (kept: {', '.join(self.branches) or 'none'})")
            b = self.branches[rest]
            self.engine.load_snapshot(b.snapshot)
            self.messages = list(b.messages)
            self._say(f"On branch {rest!r}.")
        else:
            raise ValueError(f"unknown command {name} (/help lists them)")
        return None

    @staticmethod
    def _path(rest: str) -> Path:
        if not rest:
            raise ValueError("give a path")
        return Path(os.path.expanduser(rest))

    def _set(self, rest: str) -> None:
        key, _, value = rest.partition(" ")
        value = value.strip()
        if key == "system":
            self.system = value or None
            self.engine.reset()
            self.messages = self._start()
            self._say("System prompt set; the conversation starts over.")
            return
        if key == "max_tokens":
            self.max_tokens = int(value)
        elif key in _FLOATS or key in _INTS:
            cast = float if key in _FLOATS else int
            cfg = dataclasses.replace(self.engine.sampler, **{key: cast(value)})
            self.engine.set_sampler(cfg)
        else:
            keys = sorted({*_FLOATS, *_INTS, "max_tokens", "system"})
            raise ValueError(f"unknown setting {key!r} (one of {', '.join(keys)})")
        self._say(f"Set {key} to {value}.")

    def _show(self) -> None:
        e, s = self.engine, self.engine.sampler
        path = getattr(e, "model_path", None)
        self._say(f"model:    {path.name if path else e.arch} ({e.arch})")
        self._say(f"context:  {e.n_past} of {e.n_ctx} tokens")
        self._say(
            f"sampler:  temperature {s.temperature}, top_p {s.top_p}, top_k {s.top_k}, "
            f"min_p {s.min_p}, repetition_penalty {s.repetition_penalty}, seed {s.seed}"
        )
        self._say(f"max_tokens {self.max_tokens}; branches: {', '.join(self.branches) or 'none'}")


def _side(path: Path) -> Path:
    return path.with_name(path.name + ".chat.json")


def enable_line_editing(history: Path) -> None:
    """readline's editing and a history file, where the platform has it."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline
        return
    history.parent.mkdir(parents=True, exist_ok=True)
    try:
        readline.read_history_file(history)
    except OSError:
        pass
    readline.set_history_length(1000)
    import atexit

    atexit.register(lambda: _save_history(readline, history))


def _save_history(readline: Any, history: Path) -> None:
    try:
        readline.write_history_file(history)
    except OSError:
        pass
