"""Tries to undo the emulated network from inside a worker container, and measures the link around it.

Every rank tries, as the unprivileged user Squall runs programs as: deleting the root qdisc
(``tc qdisc del``, and the same request sent on a netlink socket), taking ``eth0`` down
(``ip link set``, and netlink), flushing iptables (``iptables -F``, and a netfilter netlink
request), opening a raw socket, and reaching the Docker engine's socket. Rank 0 measures the TCP
round trip to rank 1 before and after (median of ``--probes``), and reports through
``squall.log``: ``refused`` (attempts that failed, of ``attempts``), ``rtt_before_ms`` and
``rtt_after_ms``. Each attempt's outcome is printed as ``attempt NAME: OUTCOME``.
"""

import argparse
import errno
import os
import shutil
import socket
import statistics
import struct
import subprocess
import time

from squall import log

NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
RTM_NEWLINK, RTM_DELQDISC = 16, 37
NLMSG_ERROR = 2
NETLINK_ROUTE, NETLINK_NETFILTER = 0, 12
NFT_MSG_DELTABLE = (10 << 8) | 2  # NFNL_SUBSYS_NFTABLES, NFT_MSG_DELTABLE


def netlink(protocol: int, kind: int, body: bytes) -> int:
    """Send one request and return the kernel's answer (0 or a negative errno)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol) as sock:
        sock.bind((0, 0))
        sock.settimeout(5)
        sock.send(struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, 1, 0) + body)
        data = sock.recv(65536)
    _, answer = struct.unpack_from("=IH", data)
    return struct.unpack_from("=i", data, 16)[0] if answer == NLMSG_ERROR else 0


def attempts() -> dict[str, str]:
    out: dict[str, str] = {}
    eth0 = socket.if_nametoindex("eth0")
    for name, argv in (("tc qdisc del", ["tc", "qdisc", "del", "dev", "eth0", "root"]),
                       ("ip link set down", ["ip", "link", "set", "eth0", "down"]),
                       ("iptables -F", ["iptables", "-t", "mangle", "-F"])):
        if shutil.which(argv[0]) is None:
            out[name] = f"refused: {argv[0]} is not installed"
            continue
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        out[name] = (f"refused: exit {proc.returncode}: {proc.stderr.strip()[:120]}" if proc.returncode
                     else "SUCCEEDED")
    requests = {
        "netlink RTM_DELQDISC": (NETLINK_ROUTE, RTM_DELQDISC, struct.pack("=BxxxiIII", 0, eth0, 0, 0xFFFFFFFF, 0)),
        "netlink RTM_NEWLINK down": (NETLINK_ROUTE, RTM_NEWLINK, struct.pack("=BxHiII", 0, 0, eth0, 0, 1)),
        "netlink nftables DELTABLE": (NETLINK_NETFILTER, NFT_MSG_DELTABLE, struct.pack("=BBH", 2, 0, 0)),
    }
    for name, (protocol, kind, body) in requests.items():
        try:
            code = netlink(protocol, kind, body)
        except OSError as exc:
            out[name] = f"refused: {exc}"
            continue
        out[name] = "SUCCEEDED" if code == 0 else f"refused: {errno.errorcode.get(-code, code)}"
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW).close()
        out["raw socket"] = "SUCCEEDED"
    except OSError as exc:
        out["raw socket"] = f"refused: {exc}"
    for path in ("/var/run/docker.sock", "/run/docker.sock"):
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(path)
            out[f"docker socket {path}"] = "SUCCEEDED"
        except OSError as exc:
            out[f"docker socket {path}"] = f"refused: {exc}"
    return out


def connect(address: str, port: int) -> socket.socket:
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection((address, port), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def rtt_ms(address: str, port: int, probes: int) -> float:
    with connect(address, port) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(probes):
            t0 = time.perf_counter()
            conn.sendall(b"p")
            conn.recv(1)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    peers = os.environ["SQUALL_PEERS"].split(",")
    port = int(os.environ["MASTER_PORT"]) + 9
    if rank == 1:
        with socket.create_server(("0.0.0.0", port)) as server:
            for _ in range(2):  # rank 0 measures twice
                conn, _ = server.accept()
                with conn:
                    while data := conn.recv(1):
                        conn.sendall(data)
    before = None
    if rank == 0:
        before = rtt_ms(peers[1], port, args.probes)
    tried = attempts()
    for name, outcome in tried.items():
        print(f"attempt {name}: {outcome}", flush=True)
    refused = sum(outcome.startswith("refused") for outcome in tried.values())
    figures = {"refused": refused, "attempts": len(tried), "uid": os.getuid()}
    if rank == 0:
        figures.update(rtt_before_ms=before, rtt_after_ms=rtt_ms(peers[1], port, args.probes))
    log(step=1, **figures)


if __name__ == "__main__":
    main()
