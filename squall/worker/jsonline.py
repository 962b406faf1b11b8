"""One JSON object on one line: the framing of every control socket (the job agent's, the node agents',
the echo probe's), read and written here only.

Each exchange is one request line and one answer line on a connection of its own, so a reader stops
at the first newline. What a peer sent is decoded as JSON and nothing else (never pickle, never
eval), at most ``limit`` bytes of it: a line longer than that, a connection closed before its
newline, bytes after the newline, text that is not JSON or JSON that is not an object raise
:class:`LineError` with the reason, before any field is looked at.

This module is plain stdlib: the worker side (the agent, the diagnostic jobs) and the host side
(the agent client, the swarm wire) both import it.
"""

from __future__ import annotations

import json
import socket
from typing import Any

RECV_BYTES = 1 << 16  # bytes asked of the socket at a time


class LineError(ValueError):
    """A peer's line that is not one JSON object within the limit: malformed, oversize or cut short."""


def decode_line(data: bytes, *, limit: int) -> dict[str, Any]:
    """The JSON object in ``data`` (one line, its newline optional), or :class:`LineError` saying why not."""
    line = data[:-1] if data.endswith(b"\n") else data
    if len(line) > limit:
        raise LineError(f"a line of {len(line)} bytes, longer than the limit of {limit}")
    if b"\n" in line:
        raise LineError("more than one line: one request or answer per connection")
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
        raise LineError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def encode_line(obj: dict[str, Any]) -> bytes:
    """``obj`` as one compact JSON line (enums that are ``str`` are written as their strings)."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def read_line(sock: socket.socket, *, limit: int) -> dict[str, Any]:
    """Read one line from ``sock`` (blocking, under the socket's own timeout) and decode it.

    :raises LineError: the peer closed the connection before a newline, sent more than ``limit``
        bytes, sent bytes after the newline, or a line that is not one JSON object.
    :raises OSError: the socket failed or timed out.
    """
    buf = bytearray()
    while True:
        chunk = sock.recv(RECV_BYTES)
        if not chunk:
            raise LineError(f"the peer closed the connection after {len(buf)} bytes, before a whole line")
        buf += chunk
        if b"\n" in chunk:  # only the new bytes are searched: a long line costs one pass
            break
        if len(buf) > limit:
            raise LineError(f"a line longer than the limit of {limit} bytes")
    line, _, rest = bytes(buf).partition(b"\n")
    if rest:
        raise LineError(f"{len(rest)} bytes after the line: one request or answer per connection")
    return decode_line(line, limit=limit)


def write_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    """Send ``obj`` as one JSON line."""
    sock.sendall(encode_line(obj))
