"""Transports: point-to-point messaging between ranks, with deadlines, failure detection and counters.

* :class:`Transport` (:mod:`~squall.transport.base`) is the one interface;
* :mod:`~squall.transport.inproc`: endpoints in one event loop, for unit tests of the maths;
* :mod:`~squall.transport.tcp`: a lazily connected TCP mesh, zero-copy sends;
* :mod:`~squall.transport.udp`: datagrams without retransmission, chunked tensors
  reassembled into a :class:`PartialTensor` with a mask of what arrived;
* :mod:`~squall.transport.rejoinable` (in-process) and :mod:`~squall.transport.rejoinable_tcp`:
  a :class:`PeerNet` for peers that are killed and restarted: no failure state, a send to an
  unreachable peer raises :class:`PeerUnreachable` and the next one tries again
  (:class:`RejoinableTransport` shows one as a :class:`Transport`).

This package imports only :mod:`squall.wire`, the standard library, numpy and torch.
"""

from __future__ import annotations

from squall.transport.base import DEFAULT_TIMEOUT, Transport
from squall.transport.counters import PeerCounters
from squall.transport.errors import PeerFailed, TransportClosed, TransportError, TransportTimeout
from squall.transport.inproc import InProcNetwork, InProcTransport, inproc_mesh
from squall.transport.reassembly import PartialTensor
from squall.transport.rejoinable import InProcHub, InProcPeerNet, PeerNet, PeerUnreachable, RejoinableTransport
from squall.transport.rejoinable_tcp import TcpPeerNet
from squall.transport.tcp import TcpTransport, tcp_mesh
from squall.transport.udp import UdpTransport, udp_mesh

__all__ = [
    "DEFAULT_TIMEOUT",
    "InProcHub",
    "InProcNetwork",
    "InProcPeerNet",
    "InProcTransport",
    "PartialTensor",
    "PeerCounters",
    "PeerFailed",
    "PeerNet",
    "PeerUnreachable",
    "RejoinableTransport",
    "TcpPeerNet",
    "TcpTransport",
    "Transport",
    "TransportClosed",
    "TransportError",
    "TransportTimeout",
    "UdpTransport",
    "inproc_mesh",
    "tcp_mesh",
    "udp_mesh",
]
