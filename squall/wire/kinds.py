"""Message types and header flags: what each message says, in the sender's voice."""

from __future__ import annotations

from enum import IntEnum, IntFlag


class MsgType(IntEnum):
    """The one-byte message type in every header.

    The payload layout follows from the type: ``HELLO``, ``CONTROL`` and ``ABORT`` carry a
    control object, ``TENSOR`` and ``CHUNK`` a tensor descriptor plus element data,
    ``HEARTBEAT`` and ``BYE`` nothing at all.
    """

    HELLO = 1  # "I am rank r of n, speaking wire version v; may we talk?"
    TENSOR = 2  # "here is my whole tensor for round r"
    CHUNK = 3  # "here is part k of my tensor for round r"
    CONTROL = 4  # "here is a small typed object for you (a vote, an offset, a group id)"
    HEARTBEAT = 5  # "I am still alive, even though I have nothing to say"
    BYE = 6  # "I am closing cleanly; expect nothing more from me"
    ABORT = 7  # "I give up on round r, and here is why"


#: Types whose payload is a control object (UTF-8 JSON).
CONTROL_TYPES = frozenset({MsgType.HELLO, MsgType.CONTROL, MsgType.ABORT})
#: Types whose payload is a tensor descriptor plus element data.
TENSOR_TYPES = frozenset({MsgType.TENSOR, MsgType.CHUNK})
#: Types that carry no payload.
EMPTY_TYPES = frozenset({MsgType.HEARTBEAT, MsgType.BYE})


class Flags(IntFlag):
    """Header flag bits. Unknown bits are rejected so that they stay free for later versions."""

    NONE = 0
    PAYLOAD_CRC = 1  # "the payload_crc field holds the CRC-32 of my payload: check it"


KNOWN_FLAGS = int(Flags.PAYLOAD_CRC)
