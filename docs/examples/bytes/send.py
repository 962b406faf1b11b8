"""Sends a known number of bytes over TCP, to check the kernel's byte counters against it.

Rank ``--from`` connects to rank ``--to`` (addresses from SQUALL_PEERS, port MASTER_PORT + 7) and
sends ``--bytes`` bytes of payload, then waits for the receiver to confirm the count; every other
rank sends nothing. Both print ``sent N`` / ``received N``; the sender also says how many connection
attempts it made (an attempt before the receiver listens is refused: a SYN one way, a RST back).
"""

import argparse
import os
import socket
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=10_000_000)
    parser.add_argument("--from", dest="src", type=int, default=0)
    parser.add_argument("--to", dest="dst", type=int, default=1)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    peers = os.environ["SQUALL_PEERS"].split(",")
    port = int(os.environ["MASTER_PORT"]) + 7
    if rank == args.dst:
        with socket.create_server(("0.0.0.0", port)) as server:
            conn, _ = server.accept()
            with conn:
                got = 0
                while got < args.bytes:
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    got += len(chunk)
                conn.sendall(b"k")  # one byte back: the count is in
        print(f"received {got}", flush=True)
    elif rank == args.src:
        deadline = time.monotonic() + 60
        attempts = 0
        while True:
            attempts += 1
            try:
                conn = socket.create_connection((peers[args.dst], port), timeout=5)
                conn.settimeout(None)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with conn:
            block = b"\x5a" * (1 << 20)
            left = args.bytes
            while left:
                left -= conn.send(block[: min(left, len(block))])
            conn.recv(1)
        print(f"sent {args.bytes} attempts {attempts}", flush=True)


if __name__ == "__main__":
    main()
