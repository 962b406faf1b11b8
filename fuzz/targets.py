"""One fuzz target per decoder: bytes in, a decoded value or a documented error out.

Each target is ``(function, allowed)``: ``function(data)`` feeds ``data`` to one decoder the way a
peer's bytes reach it, and ``allowed`` holds the only exception types the decoder documents for
bad input. Anything else escaping (``IndexError``, ``struct.error``, ``RecursionError``,
``MemoryError``, an ``AssertionError`` from a check below) is a finding.

The wire targets decode under :data:`FUZZ_LIMITS` (payloads of at most 64 MiB), so what a
decoder may allocate for one input is bounded by its own validated limits; see ``fuzz/README.md``.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
from collections.abc import Callable
from typing import Final

import numpy as np
import torch

from squall.cluster.swarm.wire import NodeCommand
from squall.profiles import ProfileError, parse_profile
from squall.profiles.availability import parse_availability
from squall.profiles.link_traces import parse_trace
from squall.protocols.al_dsgd.exchange import HEADER_LEN, parse_header
from squall.protocols.demo.dct import plan as demo_plan
from squall.protocols.demo.wire import SCHEMA as DEMO_SCHEMA
from squall.protocols.demo.wire import check_indices, chunk_limits
from squall.protocols.dropcompute.abort import decode_notice
from squall.protocols.moshpit import messages as moshpit
from squall.protocols.swarm.frames import FrameError, from_message, parse_frame
from squall.training.compress import COMPRESSORS, SCHEMAS, Fp4E3M0
from squall.training.compress.fp4 import SCHEMA as FP4_SCHEMA
from squall.transport.reassembly import Reassembler
from squall.wire import (
    FrameDecoder,
    MsgType,
    WireError,
    WireLimits,
    decode_datagram,
    decode_frame,
    decode_message,
    unpack_compressed,
)
from squall.worker.commands import AgentCommand, UnknownCommand, command_of
from squall.worker.jsonline import LineError, decode_line, read_line

ALLOC_LIMIT_BYTES: Final = 64 << 20  # the brief's per-input allocation bound
FUZZ_LIMITS: Final = WireLimits(max_message_bytes=ALLOC_LIMIT_BYTES)
Target = tuple[Callable[[bytes], None], tuple[type[BaseException], ...]]


def wire(data: bytes) -> None:
    """One complete frame (header + payload) -> Message: ``squall/wire/codec.py``."""
    message = decode_frame(data, limits=FUZZ_LIMITS, copy=True)
    if message.tensor is not None:
        assert message.tensor.numel() * message.tensor.element_size() <= len(data)


def framing(data: bytes) -> None:
    """A byte stream cut at arbitrary points -> frames: ``squall/wire/framing.py`` (FrameDecoder).

    The first byte picks the cut size (1..256), so frames straddle ``feed`` calls in many ways.
    """
    if not data:
        return
    step = data[0] + 1
    decoder = FrameDecoder(FUZZ_LIMITS, staging_bytes=64, direct_threshold=64)
    stream = memoryview(data)[1:]
    for start in range(0, len(stream), step):
        decoder.feed(stream[start : start + step])
        while (frame := decoder.next_frame()) is not None:
            assert len(frame.payload) == frame.header.payload_len
            decode_message(frame.header, frame.payload, limits=FUZZ_LIMITS, check_crc=True)


def udp(data: bytes) -> None:
    """One received datagram, as ``UdpTransport._on_datagram`` handles it (minus the address check):
    ``decode_datagram`` then, for a ``CHUNK``, the :class:`Reassembler`, else ``decode_message``."""
    header, payload = decode_datagram(data, limits=FUZZ_LIMITS)
    if header.kind is MsgType.CHUNK:
        reassembler = Reassembler(limits=FUZZ_LIMITS, max_bytes=ALLOC_LIMIT_BYTES // 2)
        reassembler.add(header.sender, header, payload)
        reassembler.add(header.sender, header, payload)  # a duplicate is counted, not an error
        reassembler.take((header.sender, header.tag, header.round))
    elif header.kind not in (MsgType.BYE, MsgType.HEARTBEAT, MsgType.HELLO):
        decode_message(header, payload, limits=FUZZ_LIMITS, check_crc=False)


def swarm(data: bytes) -> None:
    """SwarmSGD's frame bytes (``squall/protocols/swarm/frames.py``): raw, and inside a wire frame."""
    if data[:1] == b"W":  # a whole wire message carrying the frame, as the transport delivers it
        from_message(decode_frame(data[1:], limits=FUZZ_LIMITS, copy=True))
    else:
        parse_frame(data, exchange=0)


def moshpit_messages(data: bytes) -> None:
    """Moshpit's control messages (``squall/protocols/moshpit/messages.py``) from a whole wire frame."""
    message = decode_frame(data, limits=FUZZ_LIMITS)
    if message.control is None:
        return
    op = moshpit.op_of(message)
    parse = {
        moshpit.Op.HEARTBEAT: moshpit.parse_heartbeat,
        moshpit.Op.JOIN: moshpit.parse_join,
        moshpit.Op.GROUP: moshpit.parse_group,
        moshpit.Op.REJECT: moshpit.reject_reason,
    }.get(op)
    if parse is not None:
        parse(message)


def compressed(data: bytes) -> None:
    """A compressed payload (``squall/wire/compressed.py``), then its compressor's decoder, then what
    the all-reduce does with a peer's payload (``squall/collectives/allgather.py``, ``requant.py``).

    The first byte, when the payload validates, picks a reference vector for decoders that need one
    (zeros or a ramp), so a valid payload exercises ``decode`` too. A compressor an all-reduce takes
    (no reference) then checks the payload against its own settings and adds it into a running sum,
    as :func:`squall.collectives.allreduce` does with a peer's payload.
    """
    payload = unpack_compressed(data[1:], SCHEMAS, limits=FUZZ_LIMITS)
    compressor = COMPRESSORS[payload.compressor].for_payload(payload)
    reference = None
    if compressor.guarantees.needs_reference:
        reference = np.zeros(payload.numel) if data[0] % 2 == 0 else np.linspace(-1.0, 1.0, payload.numel)
    decoded = compressor.decode(payload, reference=reference)
    assert decoded.values.shape == (payload.numel,)
    if reference is None:
        assert compressor.mismatch(payload) is None  # made with the settings it carries
        total = np.zeros(payload.numel, dtype=np.float32)
        compressor.accumulate(payload, total)
        assert np.array_equal(total, decoded.values, equal_nan=True)


STRAGGLER_WORLD: Final = 8  # the receiving job's world size for the straggler protocols' checks


def straggler_messages(data: bytes) -> None:
    """The straggler protocols' own fields in a whole wire frame: DropCompute's abort notice (a control
    message, ``squall/protocols/dropcompute/abort.py``) and AL-DSGD's header riding after the parameters (a
    float tensor, ``squall/protocols/al_dsgd/exchange.py``). Both document ``ValueError`` for bad input."""
    message = decode_frame(data, limits=FUZZ_LIMITS, copy=True)
    if message.control is not None:
        notice = decode_notice(message, world_size=STRAGGLER_WORLD)
        assert all(0 <= peer < STRAGGLER_WORLD for peer in notice.failed)
    elif message.tensor is not None and message.tensor.dtype in (torch.float32, torch.float64):
        values = message.tensor.reshape(-1)
        if values.numel() >= HEADER_LEN:
            loss = parse_header(values[-HEADER_LEN:].tolist(), sender=1, degree=2, period=0)
            assert loss >= 0 and np.isfinite(loss)


FP4_SCHEMAS: Final = {FP4_SCHEMA.compressor: FP4_SCHEMA}
DEMO_SCHEMAS: Final = {DEMO_SCHEMA.compressor: DEMO_SCHEMA}
#: The model DeMo's fuzzed pairs are checked against: a 64 x 64 matrix, a 97 x 128 one and a 128-vector.
DEMO_PLANS: Final = tuple(demo_plan(s, chunk=64, k=32) for s in ((64, 64), (97, 128), (128,)))
DEMO_LIMITS: Final = chunk_limits(DEMO_PLANS)


def lowcomm(data: bytes) -> None:
    """The low-communication family's decoders: an even first byte feeds the rest to the FP4 E3M0 payload
    decoder (``squall/training/compress/fp4.py``: ``unpack_compressed`` against its schema, then ``decode``),
    an odd one to DeMo's (``squall/protocols/demo/wire.py``: the schema, then ``check_indices`` against
    :data:`DEMO_PLANS`). What decodes has the claimed length and is finite."""
    if not data:
        return
    if data[0] % 2 == 0:
        payload = unpack_compressed(data[1:], FP4_SCHEMAS, limits=FUZZ_LIMITS)
        values = Fp4E3M0.for_payload(payload).decode(payload).values
        assert values.shape == (payload.numel,) and np.isfinite(values).all()
        return
    payload = unpack_compressed(data[1:], DEMO_SCHEMAS, limits=FUZZ_LIMITS)
    if payload.numel == len(DEMO_LIMITS):
        check_indices(payload, DEMO_LIMITS, sender=1)
        assert np.isfinite(payload.arrays["values"]).all()


def profile(data: bytes) -> None:
    """A profile file's bytes -> a validated Profile (``squall/profiles`` parse_profile)."""
    parse_profile(data, "fuzz.yaml")


def trace(data: bytes) -> None:
    """A trace file's bytes -> a Trace (``squall/profiles/link_traces.py``) or availability events
    (``availability.py``). The first byte picks the decoder and the format (bit 0: CSV or JSON,
    bit 1: link or availability trace, bit 2: a loop period)."""
    if not data:
        return
    mode, body = data[0], data[1:]
    name = "fuzz.json" if mode & 1 else "fuzz.csv"
    if mode & 2:
        events = parse_availability(body, name)
        assert all(e.duration_us is None or e.duration_us > 0 for e in events)
        return
    parsed = parse_trace(body, name, loop_us=3_600_000_000 if mode & 4 else None)
    times = [row.at_us for row in parsed.rows]
    assert times[0] == 0 and all(b - a >= 100_000 for a, b in itertools.pairwise(times))
    assert all(len(row.values) == len(parsed.columns) for row in parsed.rows)


CONTROL_LIMIT: Final = 1 << 12  # bytes in one fuzzed control line (the agents allow 1 MiB and 16 MiB)
CONTROL_SOCKET_BYTES: Final = 1 << 15  # longer inputs skip the socket pair (its buffer is about 200 kB)


def control_lines(data: bytes) -> None:
    """One line on a control socket (``squall/worker/jsonline.py``), read from a real socket pair as the
    job agent's client and the node agents read it (the peer sent ``data`` and closed), then its ``cmd``
    looked up among the job agent's and the node agents' commands (``squall/worker/commands.py``)."""
    if len(data) > CONTROL_SOCKET_BYTES:  # more than the pair's buffer holds without a reader: decoded alone
        request = decode_line(data, limit=CONTROL_LIMIT)
    else:
        a, b = socket.socketpair()
        with a, b:
            a.sendall(data)
            a.shutdown(socket.SHUT_WR)
            request = read_line(b, limit=CONTROL_LIMIT)
    assert isinstance(request, dict) and len(data) <= CONTROL_LIMIT + 1
    for commands in (AgentCommand, NodeCommand):
        with contextlib.suppress(UnknownCommand):
            assert command_of(commands, request) == request["cmd"]


TARGETS: Final[dict[str, Target]] = {
    "wire": (wire, (WireError,)),
    "framing": (framing, (WireError,)),
    "udp": (udp, (WireError,)),
    "swarm": (swarm, (FrameError, WireError)),
    "moshpit": (moshpit_messages, (moshpit.BadMessage, WireError)),
    "compressed": (compressed, (WireError,)),
    "stragglers": (straggler_messages, (WireError, ValueError)),
    "profile": (profile, (ProfileError,)),
    "trace": (trace, (ProfileError,)),
    "lowcomm": (lowcomm, (WireError, ValueError)),
    "control": (control_lines, (LineError,)),
}
