"""Services the queue tests and benches start for themselves: a redis-server on a free loopback port, without
persistence; and a poll for a condition they observe."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REDIS = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Redis:
    """A redis-server of the test's own, without persistence (a restart starts it empty)."""

    def __init__(self, tmp: Path, *options: str) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.options = options
        """More redis-server options (``--requirepass``, ``--maxmemory``)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS is not None, "redis-server is not installed (apt-get install redis-server)"
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *self.options],
            cwd=self.tmp,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # readiness: the server says so
            if b"Ready to accept connections" in line:
                return
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): Redis closes its clients' connections, as on a restart for maintenance."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def until(check: Callable[[], Any], what: str, deadline: float = 90.0) -> Any:
    """Poll ``check`` until it returns something true (the condition is observed, not timed)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
