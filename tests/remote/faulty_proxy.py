"""A small HTTP proxy in front of the S3 server that injects faults: it forwards every request unchanged except
those its `fault` function picks, which it answers with a 503 SlowDown / a 403 AccessDenied, or drops (the
connection reset without an answer). Runs in threads of the test process; counts the faults it injected."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")
DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
          b"<Message>Access Denied</Message></Error>")

Fault = Callable[[int, str, str], "str | None"]  # (request number, method, path) -> None | "503" | "403" | "reset"
# | "slow" (forwarded after `delay` seconds: a slow store, to kill a run midway)


def every(k: int, mode: str, limit: int, burst: int = 1, methods: tuple[str, ...] = ("GET", "HEAD")) -> Fault:
    """Faults on `burst` consecutive requests of `methods` out of every k, at most `limit` in all. (aiohttp
    itself retries an idempotent request once, at once and silently, when a reused keep-alive connection is
    reset (RFC 9112): a burst of 2 resets reaches the caller at least once.)"""
    seen, done = [0], [0]

    def fault(n: int, method: str, path: str) -> str | None:
        if method not in methods:
            return None
        seen[0] += 1
        if seen[0] % k < burst and seen[0] >= k and done[0] < limit:
            done[0] += 1
            return mode
        return None

    return fault


class FaultyProxy:
    def __init__(self, upstream: tuple[str, int], fault: Fault | None = None, delay: float = 0.0):
        self.upstream, self.fault, self.delay = upstream, fault or (lambda n, m, p: None), delay
        self.requests, self.faults, self.lock = 0, 0, threading.Lock()
        self.by_mode: dict[str, int] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header) of every request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.requests += 1
                    proxy.log.append((self.command, self.path, self.headers.get("Range")))
                    mode = proxy.fault(proxy.requests, self.command, self.path)
                    proxy.faults += mode not in (None, "slow")
                    if mode is not None:
                        proxy.by_mode[mode] = proxy.by_mode.get(mode, 0) + 1
                if mode == "slow":
                    time.sleep(proxy.delay)
                if mode == "reset":  # RST: close with SO_LINGER 0, no answer at all
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if mode in ("503", "403"):
                    data = SLOWDOWN if mode == "503" else DENIED
                    return self._answer(int(mode), {"Content-Type": "application/xml"}, data)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=dict(self.headers))
                    resp = conn.getresponse()
                    data = resp.read()
                    headers = {k: v for k, v in resp.getheaders()
                               if k.lower() not in ("transfer-encoding", "connection", "content-length")}
                    self._answer(resp.status, headers, data, resp.getheader("Content-Length"))
                finally:
                    conn.close()

            def _answer(self, status: int, headers: dict, data: bytes, length: str | None = None) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                # a HEAD's answer: no body, the object's length
                self.send_header("Content-Length", length if self.command == "HEAD" and length else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
