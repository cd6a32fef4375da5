"""The soak in CI: 200 mixed requests against a real `oxillama serve`
(benches/soak.py), past its session bound, with the bounds the issue sets.
The 2,000-request run's figures are in the README."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "benches" / "soak.py"
#: A small session bound, so 200 requests cross it often.
ARGS = ["--requests", "200", "--warmup", "100", "--max-sessions", "4", "--json"]


def test_soak_200_requests_holds_every_bound() -> None:
    out = subprocess.run(
        [sys.executable, str(SOAK), *ARGS],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["server_errors"] == 0, r["problems"]
    assert not r["problems"], r["problems"]
    # Every kind of the mix ran, and the session bound was crossed.
    assert set(r["kinds"]) >= {
        "complete",
        "chat",
        "stream",
        "disconnect",
        "grammar",
        "json",
        "choices",
        "session",
        "invalid",
    }
    assert r["session_metrics"], "the server reported no session metrics"
    w, e = r["after_warmup"], r["end"]
    assert e["rss_kib"] <= 1.05 * w["rss_kib"], (w, e)
    assert e["kv_pages_free"] == w["kv_pages_free"], (w, e)
    assert e["fds"] == w["fds"], (w, e)
    assert r["last_quarter"]["p99"] <= 1.5 * r["first_quarter"]["p99"], r
    assert r["failed"] == []
