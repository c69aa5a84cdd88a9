"""An OpenAI-compatible chat server on 127.0.0.1 whose answers each test scripts.

kindex reaches it through litellm (``openai/<name>`` with an api base) exactly as it would a real provider, so
the tests exercise the real HTTP path: request bodies, status codes, headers, timeouts and dropped connections.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """What the server does with one request."""

    content: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    hang: bool = False
    drop: bool = False
    no_choices: bool = False
    latency: float = 0.0
    trickle: float = 0.0
    """Seconds between the bytes of the body: a server that keeps the connection alive but never finishes."""
    finish_reason: str = "stop"
    """``length``: the answer stopped at the token limit."""


Script = Callable[[dict[str, Any]], Reply]


def user_text(request: dict[str, Any]) -> str:
    """The first user message of a chat request (the one kindex renders from its templates)."""
    text: str = next(m["content"] for m in request["messages"] if m["role"] == "user")
    return text


def is_root(request: dict[str, Any]) -> bool:
    return "Theme folders" in user_text(request)


def doc_path(request: dict[str, Any]) -> str:
    m = re.search(r"^Document path: (.+)$", user_text(request), re.MULTILINE)
    assert m, "not a document request"
    return m.group(1)


def good_doc(request: dict[str, Any]) -> dict[str, Any]:
    path = doc_path(request)
    return {"title": f"标题 {path}", "summary": f"关于 {path} 的摘要。", "tags": ["标签", path]}


def good_root(request: dict[str, Any]) -> dict[str, Any]:
    text = user_text(request)
    dirs = re.findall(r"^- dir: (\S+)", text, re.MULTILINE)
    paths = re.findall(r"^- path: (.+)$", text, re.MULTILINE)
    return {
        "themes": [{"dir": d, "title": f"主题 {d}", "summary": f"{d} 的内容", "tags": [d]} for d in dirs],
        "documents": [{"path": p, "title": f"根 {p}", "summary": f"{p} 摘要", "tags": ["根"]} for p in paths],
    }


def well_behaved(request: dict[str, Any]) -> Reply:
    """A model that follows the instructions."""
    obj = good_root(request) if is_root(request) else good_doc(request)
    return Reply(json.dumps(obj, ensure_ascii=False))


class FakeLLM:
    """The server; ``script`` decides each reply, ``requests`` records every request body received."""

    def __init__(self) -> None:
        self.script: Script = well_behaved
        self.requests: list[dict[str, Any]] = []
        self._arrived = threading.Condition()
        self._release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes; without NODELAY, Nagle's algorithm and the client's
                # delayed ACK add ~40 ms to every answer, which no real provider does.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                with fake._arrived:
                    fake.requests.append(body)
                    fake._arrived.notify_all()
                reply = fake.script(body)
                if reply.latency:
                    fake._release.wait(reply.latency)  # a slow provider; released at once when the server stops
                if reply.hang:
                    fake._release.wait(30)
                    self.close_connection = True
                    return
                if reply.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if reply.raw_body is not None:
                    payload = reply.raw_body
                else:
                    choices = (
                        []
                        if reply.no_choices
                        else [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": reply.content},
                                "finish_reason": reply.finish_reason,
                            }
                        ]
                    )
                    data: dict[str, Any] = {
                        "id": f"chatcmpl-{len(fake.requests)}",
                        "object": "chat.completion",
                        "created": 1700000000,
                        "model": body.get("model", "fake"),
                        "choices": choices,
                        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                    }
                    if reply.status >= 400:
                        data = {"error": {"message": reply.content or "fake error", "type": "fake", "code": None}}
                    payload = json.dumps(data, ensure_ascii=False).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if reply.trickle:
                    for i in range(len(payload)):
                        if fake._release.wait(reply.trickle):
                            return
                        self.wfile.write(payload[i : i + 1])
                        self.wfile.flush()
                    return
                self.wfile.write(payload)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A short poll interval: stop() (server.shutdown) waits for the next poll, 0.5 s by default, in every test.
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for_requests(self, count: int, timeout: float = 60.0) -> None:
        """Block until ``count`` requests have arrived (a test's synchronisation point, not a sleep)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"only {len(self.requests)} of {count} requests arrived")

    def doc_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if not is_root(r)]

    def root_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if is_root(r)]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-answer (a worker killed by a test) is expected, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main() -> None:
    """Serve well-behaved answers after a fixed latency until killed: ``python -m tests.fakellm LATENCY``."""
    latency = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    server = FakeLLM()
    server.script = lambda r: Reply(well_behaved(r).content, latency=latency)
    print(server.url, flush=True)
    server.server.serve_forever()


if __name__ == "__main__":
    main()
