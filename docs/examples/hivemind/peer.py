r"""A hivemind peer: its own DHT and DecentralizedAverager average one tensor with the other peers.

Nothing in it knows about Squall. It reads the launcher's usual variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) and rendezvous the way many torchrun-launched scripts do, through
torch.distributed's TCPStore on rank 0: rank 0 starts the DHT and publishes its multiaddresses there,
the others read them and join. Every peer's tensor starts at zero; each round every peer adds
``2 ** rank`` to it and averages it with the others, then prints ``round R error E`` (E: how far its
tensor is from the exact mean of all peers', relative to that mean). Powers of two, because no proper
subset of them has the same mean as all of them (checked up to 16 peers): an all-reduce whose parts
were averaged over some peers only cannot pass as exact (with ``rank``, ranks 0 and 3 alone average
to the mean of 0..3). Added every round, because peers that already agree would still agree after
any partial average: each round's check then tells as much as the first's.

hivemind's all-reduce tolerates a peer that fails part-way: the others keep their own values for the
parts it did not deliver, and the round still returns. After such a round the peers hold different
tensors. So a round here counts only when every peer ends it holding the same tensor (they compare
its sum and norm through the store); otherwise every peer restores its tensor and the round is
repeated, at most ``--attempts`` times.

    squall run --workers 4 --profile wan-50ms-100mbit --requirements requirements.txt \
        --metric 'error=error (\S+)' --target 'error<=1e-6' -- python peer.py

Behind a NAT (``--profile volunteers-behind-nat``: every rank but 0 behind its own) a peer cannot be
dialled; ``--client-mode 1,2,3`` runs those ranks' DHT and averager in hivemind's client mode: they
dial out, announce no address and take no part of the tensor to aggregate.
"""

import argparse
import datetime
import os
import sys
import time

import hivemind
import torch
from hivemind.averaging import DecentralizedAverager
from torch.distributed import TCPStore

FAILED = "failed"


def agree(store: TCPStore, key: str, rank: int, world: int, mine: str) -> list[str]:
    """Publish this peer's ``mine`` under ``key`` and return every peer's, once all have published."""
    store.set(f"{key}/{rank}", mine)
    keys = [f"{key}/{r}" for r in range(world)]
    store.wait(keys)
    return [store.get(k).decode() for k in keys]


def same_tensor(digests: list[str]) -> bool:
    """Whether every peer's (sum, norm) matches the others' up to float32 rounding."""
    if FAILED in digests:
        return False
    for column in zip(*(tuple(map(float, d.split())) for d in digests), strict=True):
        if max(column) - min(column) > 1e-5 * max(1.0, *map(abs, column)):
            return False
    return True


def start_dht(store: TCPStore, rank: int, master: str, port: int, client: bool) -> hivemind.DHT:
    """Rank 0 starts the DHT and publishes its addresses in the store; the others join through them.
    A client announces no address and listens on none."""
    me = os.environ.get("SQUALL_PEERS", "").split(",")[rank] if os.environ.get("SQUALL_PEERS") else master
    dht_args = {"client_mode": True, "start": True} if client else {
        "host_maddrs": [f"/ip4/0.0.0.0/tcp/{port}"], "announce_maddrs": [f"/ip4/{me}/tcp/{port}"], "start": True}
    if rank == 0:
        dht = hivemind.DHT(**dht_args)
        store.set("maddrs", " ".join(str(m) for m in dht.get_visible_maddrs()))
        return dht
    return hivemind.DHT(initial_peers=store.get("maddrs").decode().split(), **dht_args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=5, help="tries of one round before giving up")
    parser.add_argument("--size", type=int, default=1024, help="elements of the averaged tensor")
    parser.add_argument("--port", type=int, default=0, help="the DHT's TCP port (0: MASTER_PORT + 1)")
    parser.add_argument("--client-mode", default="", help="ranks (comma-separated) that run hivemind in client "
                        "mode: they dial out and accept no connection, as a peer behind NAT must")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master, master_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    port = args.port or master_port + 1
    # libp2p dials from its listening port by default, so two peers that dial each other at once send SYNs
    # between the same two addresses; when they cross in flight (likely at 50 ms one way) TCP joins them into
    # one connection that both ends think they opened, and its security handshake fails. Dial from fresh ports.
    os.environ.setdefault("LIBP2P_TCP_REUSEPORT", "false")
    store = TCPStore(master, master_port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=180))
    client = str(rank) in args.client_mode.split(",")
    dht = start_dht(store, rank, master, port, client)
    tensor = torch.zeros(args.size)
    # next_chunk_timeout: a peer that stops sending is dropped from the round after 10 s instead of being
    # awaited for ever; the round then fails the agreement below and is repeated
    averager = DecentralizedAverager([tensor], dht, prefix="squall_example", target_group_size=world,
                                     min_group_size=world, min_matchmaking_time=3.0, request_timeout=2.0,
                                     next_chunk_timeout=10.0, allreduce_timeout=60.0, client_mode=client,
                                     start=True)
    agree(store, "ready", rank, world, "up")  # every peer's averager is up before the first round
    for r in range(1, args.rounds + 1):
        t0 = time.monotonic()
        for attempt in range(1, args.attempts + 1):
            with averager.get_tensors() as tensors:
                before = tensors[0].clone()
                tensors[0].add_(float(2 ** rank))  # this round's own contribution
            try:  # no retries inside step: a retry could join the other peers' next round
                group = averager.step(timeout=60, allow_retries=False)
            except Exception as e:  # hivemind raises when matchmaking or the all-reduce fails
                print(f"round {r} attempt {attempt}: {e!r}", file=sys.stderr, flush=True)
                group = None
            with averager.get_tensors() as tensors:
                t = tensors[0].double()
                mine = f"{float(t.sum()):.9e} {float(t.norm()):.9e}" if group is not None else FAILED
            digests = agree(store, f"round{r}.{attempt}", rank, world, mine)
            if same_tensor(digests):
                break
            with averager.get_tensors() as tensors:
                tensors[0].copy_(before)
            print(f"round {r} attempt {attempt}: the peers ended with different tensors ({digests}); "
                  "every peer repeats the round", file=sys.stderr, flush=True)
        else:
            sys.exit(f"round {r}: none of {args.attempts} attempts left every peer with the same tensor")
        exact = r * (2 ** world - 1) / world
        with averager.get_tensors() as tensors:
            error = float((tensors[0].double() - exact).abs().max()) / exact
        print(f"round {r} attempts {attempt} group {len(group) if group else 0} error {error:.3g} "
              f"took {time.monotonic() - t0:.2f}", flush=True)
    agree(store, "done", rank, world, "done")  # nobody leaves while another still averages with it
    store.add("left", 1)
    while rank == 0 and int(store.add("left", 0)) < world:  # rank 0 serves the store: it leaves last
        time.sleep(0.05)
    averager.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
