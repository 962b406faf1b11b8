"""The TCP handshake: what a ``HELLO`` says, how it is checked, and who wins a simultaneous connect.

The dialer speaks first: ``HELLO`` with its rank in the header and ``{"world_size", "heartbeat"}``
in the body. The acceptor answers with its own ``HELLO`` adding ``"accept"`` and, when refusing,
a ``"reason"``. Both sides check that the other end is the rank they expect, that the world
sizes agree and that every field has the right type.

:func:`refusal` is the whole simultaneous-connect rule, kept pure so that it can be read and
tested on its own: *the connection dialled by the lower rank wins*. Evaluated independently
by each acceptor, it leaves both ends with the same single connection (see
:mod:`squall.transport.tcp`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from squall.wire import (
    DEFAULT_LIMITS,
    EncodedFrame,
    Frame,
    Message,
    MsgType,
    WireLimits,
    decode_message,
    encode_message,
)

#: Reason of a refusal that means "my own connection to you is on its way: wait for it".
WAIT = "wait"


class HandshakeError(Exception):
    """The other end answered the handshake in a way we cannot work with.

    :param fatal: retrying cannot help (misconfiguration or inconsistent state).
    """

    def __init__(self, reason: str, *, fatal: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal


@dataclass(frozen=True, slots=True)
class Hello:
    """A parsed and type-checked ``HELLO``."""

    rank: int  # the sender, from the header
    world_size: int  # the sender's idea of the number of ranks
    heartbeat: float | None  # the sender's heartbeat interval, if it sends heartbeats
    accept: bool | None = None  # replies only: whether the acceptor takes the connection
    reason: str | None = None  # replies only: why not


def hello_frame(
    *,
    rank: int,
    world_size: int,
    heartbeat: float | None,
    accept: bool | None = None,
    reason: str | None = None,
    limits: WireLimits = DEFAULT_LIMITS,
) -> EncodedFrame:
    """The encoded ``HELLO`` (a dialer's opening if ``accept`` is ``None``, else a reply)."""
    body: dict[str, Any] = {"world_size": world_size, "heartbeat": heartbeat}
    if accept is not None:
        body["accept"] = accept
    if reason is not None:
        body["reason"] = reason
    return encode_message(Message.of_control(body, kind=MsgType.HELLO), sender=rank, limits=limits)


def parse_hello(
    frame: Frame, *, ranks: Collection[int], expect: int | None, limits: WireLimits = DEFAULT_LIMITS
) -> Hello:
    """Check a received ``HELLO``: from one of ``ranks`` (and from ``expect``, if given), well typed.

    :raises HandshakeError: (fatal) the frame is not an acceptable ``HELLO``.
    :raises WireError: the payload does not decode.
    """
    header = frame.header
    if header.kind is not MsgType.HELLO:
        raise HandshakeError(f"expected HELLO, got {header.kind.name}", fatal=True)
    if header.sender not in ranks:
        raise HandshakeError(f"HELLO from unknown rank {header.sender}", fatal=True)
    if expect is not None and header.sender != expect:
        raise HandshakeError(f"dialled rank {expect} but rank {header.sender} answered", fatal=True)
    body = decode_message(header, frame.payload, limits=limits).control
    assert body is not None
    return Hello(
        rank=header.sender,
        world_size=_field(body, "world_size", int),
        heartbeat=_heartbeat(body.get("heartbeat")),
        accept=_field(body, "accept", bool, optional=True),
        reason=_field(body, "reason", str, optional=True),
    )


def refusal(
    *, me: int, world_size: int, hello: Hello, connected: bool, failed: str | None, dialing: bool
) -> str | None:
    """Why the acceptor ``me`` must refuse the connection that ``hello.rank`` dialled, or ``None``.

    :param connected: ``me`` already has a connection to the dialer.
    :param failed: why ``me`` considers the dialer failed, if it does (no reconnection).
    :param dialing: ``me`` is itself dialling the dialer right now.
    """
    if hello.world_size != world_size:
        return f"world_size mismatch: {hello.world_size} != {world_size}"
    if failed is not None:
        return f"rank {hello.rank} was already marked failed: {failed}"
    if connected:
        return f"already connected to {hello.rank}"
    if dialing and hello.rank > me:
        return WAIT  # my dial wins: the dialer will accept it and must wait for it
    return None


def _field(body: Any, name: str, kind: type, *, optional: bool = False) -> Any:
    value = body.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise HandshakeError(f"HELLO field {name!r} should be {kind.__name__}, got {value!r}", fatal=True)
    return value


def _heartbeat(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise HandshakeError(f"bad heartbeat interval {value!r}", fatal=True)
    return float(value)
