"""Memory an MCP server over streamable HTTP keeps per client session, and the time of a session's calls.

    python bench/mcp_sessions.py [--sessions 2000] [--compare CHECKOUT]     (needs: pip install -e '.[dev]')

Starts `kindex mcp --kb-root ROOT --http` (ROOT: a copy of sample_kb as agent `a`) from this checkout and, with
``--compare``, from another one (its `kindex` package first on `sys.path`), one after the other. Each session is
what a client that opens one per call sends: `initialize`, `notifications/initialized` and one `tools/call` of
`search`, with the session id the server gave (if it gave one), and no DELETE at the end (clients that crash or
are killed never send it). Reports the server's resident memory before and after, per session, and the median
time of a session's three requests; then 500 calls in one session, the median of their times.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parent.parent
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _session(http: httpx2.Client, url: str, n: int, calls: int = 1) -> list[float]:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    r = http.post(url, json=init, headers=HEADERS)
    r.raise_for_status()
    headers = dict(HEADERS)
    sid = r.headers.get("mcp-session-id")
    if sid:
        headers["mcp-session-id"] = sid
    if "mcp-protocol-version" not in headers:
        headers["mcp-protocol-version"] = "2025-06-18"
    http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    times = []
    for i in range(calls):
        call = {
            "jsonrpc": "2.0",
            "id": 2 + i,
            "method": "tools/call",
            "params": {"name": "search", "arguments": {"agent": "a", "question": f"退款多久到账 {n}"}},
        }
        t0 = time.perf_counter()
        r = http.post(url, json=call, headers=headers)
        times.append(time.perf_counter() - t0)
        r.raise_for_status()
        if '"isError":true' in r.text.replace(" ", ""):
            raise RuntimeError(r.text[:300])
    return times


def measure(source: Path | None, root: Path, sessions: int) -> tuple[int, int, float, float]:
    port = _free_port()
    where = f"import sys; sys.path.insert(0, {str(source)!r}); " if source else ""
    code = (
        f"{where}from kindex.cli import main; main(['mcp', '--kb-root', {str(root)!r}, '--http', '--port', '{port}'])"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        with httpx2.Client(timeout=60) as http:
            for _ in range(300):
                try:
                    _session(http, url, 0)
                    break
                except httpx2.TransportError:
                    time.sleep(0.1)  # the server is still starting
            for n in range(20):  # warm: tables loaded, code paths taken
                _session(http, url, n)
            before = _rss_kb(server.pid)
            times = []
            for n in range(sessions):
                t0 = time.perf_counter()
                _session(http, url, n)
                times.append(time.perf_counter() - t0)
            after = _rss_kb(server.pid)
            calls = _session(http, url, 0, calls=500)
    finally:
        server.terminate()
        server.wait(10)
    return before, after, statistics.median(times) * 1000, statistics.median(calls) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--compare", type=Path, help="another checkout, measured the same way after this one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "agents"
        shutil.copytree(REPO / "sample_kb", root / "a", ignore=shutil.ignore_patterns(".kindex", "index.json"))
        subprocess.run([sys.executable, "-m", "kindex", "reindex", str(root / "a")], check=True, capture_output=True)
        print(
            f"| server ({args.sessions} sessions, none closed) | RSS before | after | per session | session p50 "
            "| call p50 (500 in one session) |"
        )
        print("|---|---|---|---|---|---|")
        for label, source in (("this checkout", None), (str(args.compare), args.compare)):
            if label != "this checkout" and source is None:
                continue
            before, after, p50, call = measure(source, root, args.sessions)
            per = (after - before) / args.sessions
            print(
                f"| {label} | {before / 1024:.1f} MB | {after / 1024:.1f} MB | {per:.1f} KB | {p50:.1f} ms "
                f"| {call:.2f} ms |"
            )


if __name__ == "__main__":
    main()
