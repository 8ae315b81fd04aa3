"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the tests' S3-compatible server (tests/s3_server.py).

Object storage fails in ways a local directory does not; the proxy causes them for real, on the wire,
between pyarrow's S3 client and the server: a PUT whose body is cut half-way (the connection closed
mid-upload), a segment's PUT never answered (a timeout), credentials the server calls expired
(``ExpiredToken``, as S3 answers a session token past its end), and a listing answered slowly.
Every other request passes through unchanged. ``fault`` is read per request, so a test turns a fault on
for one run and off for the next.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

EXPIRED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code>'
           b"<Message>The provided token has expired.</Message></Error>")


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = urlsplit(upstream)
        self.fault: str | None = None  # "cut-put", "hang", "expired", "slow-list"
        self.slow_seconds = 2.0
        self.hits = 0  # requests the fault struck
        self.requests: dict[str, int] = {}  # every request relayed or struck, by method (what a capture costs)

    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up (the timeout under test) breaks the pipe: expected, not news

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultProxy

    def log_message(self, fmt: str, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        self.server.requests[self.command] = self.server.requests.get(self.command, 0) + 1
        fault = self.server.fault
        is_put = self.command == "PUT" and ".parquet" in self.path
        is_list = self.command == "GET" and "list-type=2" in self.path
        if fault == "cut-put" and is_put:
            self.server.hits += 1
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length // 2)  # half the segment arrived, then the connection is lost
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if fault == "hang" and is_put:
            self.server.hits += 1
            time.sleep(60)  # never answered within the client's timeout
            self.close_connection = True
            return
        body = self._body()
        if fault == "expired" and self.command in ("GET", "PUT", "HEAD"):
            self.server.hits += 1
            self.send_response(400 if self.command != "HEAD" else 403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(EXPIRED) if self.command != "HEAD" else 0))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(EXPIRED)
            return
        if fault == "slow-list" and is_list:
            self.server.hits += 1
            time.sleep(self.server.slow_seconds)
        upstream = http.client.HTTPConnection(self.server.upstream.hostname, self.server.upstream.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "content-length", "expect")}
        headers["Content-Length"] = str(len(body))
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "content-length", "connection", "server", "date"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
