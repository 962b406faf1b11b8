"""Delete an (empty) nftables table through nfnetlink: the one step iptables-nft cannot undo.

``iptables -t mangle -N CHAIN`` on the nf_tables backend creates the whole ``ip mangle`` table with
its five base chains, and deleting the chain leaves them behind. To leave a namespace exactly as
it was found, the iptables helpers delete the table again when it created it and it is empty. There
is no ``nft`` binary here, so this sends the one message itself, inside a batch as nf_tables
requires::

    NFNL_MSG_BATCH_BEGIN  (res_id = NFNL_SUBSYS_NFTABLES)
    NFT_MSG_DELTABLE      family NFPROTO_IPV4, NFTA_TABLE_NAME "mangle", NLM_F_ACK
    NFNL_MSG_BATCH_END
"""

from __future__ import annotations

import os
import socket
import struct

from squall.shaping.kernel.netlink import NETLINK_NETFILTER, NLM_F_ACK, NLM_F_REQUEST, NLMSGHDR, attr, wait_ack
from squall.shaping.kernel.netns import socket_in

NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_DELTABLE = NFNL_SUBSYS_NFTABLES << 8 | 2
NFTA_TABLE_NAME = 1
NFPROTO_IPV4 = 2

_NFGENMSG = struct.Struct("!BBH")


def _msg(kind: int, *, flags: int, seq: int, family: int, res_id: int, payload: bytes = b"") -> bytes:
    body = _NFGENMSG.pack(family, 0, res_id) + payload
    return NLMSGHDR.pack(16 + len(body), kind, flags, seq, 0) + body


def delete_table_batch(table: str, seq: int, family: int = NFPROTO_IPV4) -> bytes:
    """The three-message batch that deletes ``table``; the delete carries sequence ``seq + 1``."""
    name = attr(NFTA_TABLE_NAME, table.encode() + b"\0")
    return (
        _msg(
            NFNL_MSG_BATCH_BEGIN,
            flags=NLM_F_REQUEST,
            seq=seq,
            family=socket.AF_UNSPEC,
            res_id=NFNL_SUBSYS_NFTABLES,
        )
        + _msg(
            NFT_MSG_DELTABLE,
            flags=NLM_F_REQUEST | NLM_F_ACK,
            seq=seq + 1,
            family=family,
            res_id=0,
            payload=name,
        )
        + _msg(
            NFNL_MSG_BATCH_END,
            flags=NLM_F_REQUEST,
            seq=seq + 2,
            family=socket.AF_UNSPEC,
            res_id=NFNL_SUBSYS_NFTABLES,
        )
    )


def delete_table(netns: str, table: str = "mangle", family: int = NFPROTO_IPV4) -> None:
    """Delete ``table`` (and whatever it still holds) in the namespace at ``netns``; raise OSError."""
    sock = socket_in(netns, socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.settimeout(5.0)
        sock.bind((0, 0))
        seq = 1
        sock.send(delete_table_batch(table, seq, family))
        code = wait_ack(sock, seq + 1)
        if code:
            raise OSError(code, f"delete nft table {table}: {os.strerror(code)}")
    finally:
        sock.close()
