"""The NFQUEUE wire format: messages built and parsed without a kernel."""

from __future__ import annotations

import socket
import struct

from squall.shaping.kernel.netlink import NLMSG_ERROR, attr
from squall.shaping.kernel.nft_table import NFT_MSG_DELTABLE, delete_table_batch
from squall.shaping.nfqueue.netlink import (
    MSG_CONFIG,
    MSG_PACKET,
    MSG_VERDICT,
    MSG_VERDICT_BATCH,
    NF_ACCEPT,
    NF_DROP,
    NFQA_CAP_LEN,
    NFQA_CFG_CMD,
    NFQA_CFG_FLAGS,
    NFQA_CFG_MASK,
    NFQA_CFG_PARAMS,
    NFQA_CFG_QUEUE_MAXLEN,
    NFQA_PACKET_HDR,
    VERDICT_SIZE,
    config_requests,
    message,
    pack_verdict_body,
    parse_datagram,
    verdict_prefix,
)
from squall.shaping.nfqueue.state import parse_kernel_stats


def _packet(queue: int, pid: int) -> bytes:
    """A packet message as the kernel sends it: PACKET_HDR first, then other attributes."""
    payload = attr(NFQA_PACKET_HDR, struct.pack("!IHB", pid, 0x0800, 0)) + attr(
        NFQA_CAP_LEN, struct.pack("!I", 84)
    )
    return message(MSG_PACKET, queue, payload, flags=0)


def _error(code: int, seq: int = 0) -> bytes:
    return struct.pack("=IHHII", 36, NLMSG_ERROR, 0, seq, 0) + struct.pack("=i", code) + b"\0" * 16


def test_attributes_are_padded_to_four_bytes() -> None:
    assert attr(1, b"abc") == struct.pack("=HH", 7, 1) + b"abc\0"
    assert len(attr(1, b"abcd")) == 8


def test_parse_packets_of_several_queues_in_one_buffer() -> None:
    buf = _packet(3, 17) + _packet(65535, 0xFFFFFFFF) + _error(-2) + _error(0)
    packets: list[tuple[int, int]] = []
    errors = parse_datagram(buf, len(buf), packets)
    assert packets == [(3, 17), (65535, 0xFFFFFFFF)]
    assert errors == 1  # an ack (0) is not an error


def test_parse_ignores_truncated_tail() -> None:
    buf = _packet(1, 5)
    packets: list[tuple[int, int]] = []
    parse_datagram(buf + b"\0" * 8, len(buf) + 8, packets)
    assert packets == [(1, 5)]


def test_verdict_layout() -> None:
    msg = verdict_prefix(7, batch=False) + pack_verdict_body(NF_ACCEPT, 1234)
    assert len(msg) == VERDICT_SIZE
    length, kind, flags, _, _ = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags) == (32, MSG_VERDICT, 1)
    assert struct.unpack_from("!BBH", msg, 16) == (socket.AF_UNSPEC, 0, 7)
    assert struct.unpack_from("=HH", msg, 20) == (12, 2)  # NFQA_VERDICT_HDR
    assert struct.unpack_from("!II", msg, 24) == (NF_ACCEPT, 1234)
    batch = verdict_prefix(7, batch=True) + pack_verdict_body(NF_DROP, 9)
    assert struct.unpack_from("=H", batch, 4)[0] == MSG_VERDICT_BATCH


def test_config_requests_bind_then_configure() -> None:
    reqs = config_requests(5, maxlen=100_000, fail_open=False)
    kinds = [struct.unpack_from("=H", r, 2)[0] for r in reqs]
    assert kinds == [NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK]
    assert struct.unpack_from("!I", reqs[2], 4)[0] == 100_000
    assert struct.unpack_from("=H", reqs[3], 10)[0] == NFQA_CFG_FLAGS
    assert struct.unpack_from("!I", reqs[3], 12)[0] == 4  # GSO only
    assert struct.unpack_from("!I", config_requests(5, maxlen=1, fail_open=True)[3], 12)[0] == 5
    full = message(MSG_CONFIG, 5, reqs[0], flags=5, seq=9)
    assert struct.unpack_from("=IHHI", full) == (len(full), MSG_CONFIG, 5, 9)


def test_nft_delete_table_batch() -> None:
    data = delete_table_batch("mangle", seq=1)
    kinds, off = [], 0
    while off < len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        kinds.append(kind)
        off += length
    assert kinds == [0x10, NFT_MSG_DELTABLE, 0x11]
    assert b"mangle\0" in data


def test_parse_kernel_queue_stats() -> None:
    text = (
        "    1  12345     3 1 65535     7     2      998  1\n"
        "    4  12345     0 1 65535     0     0        0  1\n"
    )
    stats = parse_kernel_stats(text)
    assert stats[1] == {
        "portid": 12345,
        "queue_total": 3,
        "queue_dropped": 7,
        "user_dropped": 2,
        "id_sequence": 998,
    }
    assert set(stats) == {1, 4}
