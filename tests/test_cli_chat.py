"""``oxillama chat`` as a person uses it, through a pseudo-terminal: slash
commands, multi-line input, and a session saved, quit, loaded in a new
process and continued exactly."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

CMD = [sys.executable, "-m", "oxillama", "chat", "-n", "12", "--temperature", "0", "-c", "512"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A process on a pseudo-terminal: readline sees a tty."""

    def __init__(self, home: Path) -> None:
        self.master, slave = pty.openpty()
        # Wide enough that readline never scrolls a long command line.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 1000, 0, 0))
        env = {**os.environ, "HOME": str(home), "TERM": "dumb"}
        self.proc = subprocess.Popen(
            CMD, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
        )
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 120) -> str:
        """Output up to and including ``text``."""
        end = time.monotonic() + timeout
        while text not in self.seen:
            left = end - time.monotonic()
            assert left > 0, f"waited for {text!r}; got {self.seen[-400:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"the process ended waiting for {text!r}: {self.seen[-400:]!r}"
                self.seen += ANSI.sub("", chunk.decode("utf-8", "replace").replace("\r", ""))
        at = self.seen.index(text) + len(text)
        out, self.seen = self.seen[:at], self.seen[at:]
        return out

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def ask(self, line: str) -> str:
        """The reply to ``line``: what comes before the next prompt, less
        the terminal's echo of the line."""
        self.send(line)
        out = self.expect(">>> ").removesuffix(">>> ")
        echo, _, reply = out.partition("\n")
        assert line[:20] in echo, (line, out)
        return reply.strip()

    def close(self) -> int:
        rc = self.proc.wait(timeout=60)
        os.close(self.master)
        return rc


def test_commands_and_an_exact_continuation_after_save_quit_load(tmp_path: Path) -> None:
    snap = tmp_path / "chat.oxisnap"
    # The uninterrupted conversation, for reference.
    t = Terminal(tmp_path)
    t.expect(">>> ")
    assert "/save PATH" in t.ask("/help")
    first = t.ask("What is the capital of France?")
    assert first and not first.startswith("/")
    assert "Saved" in t.ask(f"/save {snap}")
    second = t.ask("And of Italy?")
    assert "temperature 0.0" in t.ask("/show")
    assert "unknown command" in t.ask("/nope")
    t.send("/bye")
    assert t.close() == 0

    # A new process loads the session and continues exactly.
    t = Terminal(tmp_path)
    t.expect(">>> ")
    assert "Loaded" in t.ask(f"/load {snap}")
    assert t.ask("And of Italy?") == second
    # A fork keeps this point; the branch comes back exactly.
    assert "Branch 'a' kept" in t.ask("/fork a")
    t.ask("Say something else.")
    assert "On branch 'a'" in t.ask("/switch a")
    spain = t.ask("And of Spain?")
    t.ask("/switch a")
    assert t.ask("And of Spain?") == spain
    # A message over several lines, between lines of three quotes.
    t.send('"""')
    t.expect("... ")
    t.send("Line one")
    t.expect("... ")
    t.send("line two")
    t.expect("... ")
    assert t.ask('"""')
    assert "Set temperature" in t.ask("/set temperature 0.5")
    assert "Cleared" in t.ask("/clear")
    t.send("/bye")
    assert t.close() == 0
