"""The one JSON-line reader of every control socket: real socket pairs, every way a peer's line can be bad."""

from __future__ import annotations

import socket
import threading
from enum import StrEnum

import pytest

from squall.worker.commands import AgentCommand, UnknownCommand, command_of, known
from squall.worker.jsonline import LineError, decode_line, encode_line, read_line, write_line


def _sent(data: bytes, *, close: bool = True) -> socket.socket:
    """The reading end of a socket pair after ``data`` was sent on the other (closed unless asked not to)."""
    a, b = socket.socketpair()
    b.settimeout(10)

    def send() -> None:
        a.sendall(data)
        if close:
            a.close()

    threading.Thread(target=send, daemon=True).start()
    return b


def test_a_line_round_trips_and_enums_travel_as_their_strings() -> None:
    a, b = socket.socketpair()
    with a, b:
        write_line(a, AgentCommand.WAIT.request(job_id="j1", timeout=2.5))
        assert read_line(b, limit=100) == {"cmd": "wait", "job_id": "j1", "timeout": 2.5}
    assert encode_line({"cmd": AgentCommand.PING}) == b'{"cmd":"ping"}\n'


def test_a_line_across_many_chunks_is_read_whole() -> None:
    big = {"cmd": "run", "job": {"config": {"x": "y" * 300_000}}}
    with _sent(encode_line(big)) as sock:
        assert read_line(sock, limit=400_000) == big


@pytest.mark.parametrize(("data", "message"), [
    (b"{not json\n", "not JSON"),
    (b"\xff\xfe\n", "not JSON"),
    (b"[1, 2]\n", "expected a JSON object, got list"),
    (b'"cmd"\n', "expected a JSON object, got str"),
    (b"[" * 100_000 + b"\n", "not JSON"),  # deeper than the parser goes: an error, not a crash
    (b'{"cmd": "ping"}\n{"cmd": "run"}\n', "bytes after the line"),
])
def test_a_malformed_line_is_refused_with_the_reason(data: bytes, message: str) -> None:
    with _sent(data) as sock, pytest.raises(LineError, match=message):
        read_line(sock, limit=1 << 20)


def test_an_oversize_line_is_refused_before_the_peer_finishes() -> None:
    """The peer keeps its end open: the reader stops at the limit instead of waiting for a newline."""
    with _sent(b"x" * 5000, close=False) as sock, pytest.raises(LineError, match="longer than the limit of 100"):
        read_line(sock, limit=100)
    with _sent(b"{}" + b" " * 99 + b"\n") as sock, pytest.raises(LineError, match="longer than the limit of 100"):
        read_line(sock, limit=100)
    with _sent(b"{}" + b" " * 98 + b"\n") as sock:
        assert read_line(sock, limit=100) == {}  # exactly the limit, the newline not counted


@pytest.mark.parametrize("data", [b"", b'{"cmd": "pi'])
def test_a_connection_closed_before_the_newline_is_refused(data: bytes) -> None:
    with _sent(data) as sock, pytest.raises(LineError, match=f"closed the connection after {len(data)} bytes"):
        read_line(sock, limit=100)


def test_decode_line_alone() -> None:
    assert decode_line(b'{"a": 1}', limit=10) == {"a": 1}
    assert decode_line(b'{"a": 1}\n', limit=10) == {"a": 1}
    with pytest.raises(LineError, match="more than one line"):
        decode_line(b"{}\n{}", limit=10)
    with pytest.raises(LineError, match="a line of 11 bytes, longer than the limit of 10"):
        decode_line(b'{"a": "xx"}', limit=10)


class _Other(StrEnum):
    ONE = "one"
    TWO = "two"


def test_a_command_is_a_member_or_refused_naming_the_known_ones() -> None:
    assert command_of(AgentCommand, {"cmd": "cancel", "job_id": "j"}) is AgentCommand.CANCEL
    assert command_of(_Other, {"cmd": "two"}) is _Other.TWO
    with pytest.raises(UnknownCommand, match="unknown command 'PING'; known: ping, run, wait, cancel, shutdown"):
        command_of(AgentCommand, {"cmd": "PING"})
    with pytest.raises(UnknownCommand, match="needs a string 'cmd', got 3; known: one, two"):
        command_of(_Other, {"cmd": 3})
    assert known(_Other) == "one, two"
