r"""A hivemind peer: its own DHT and DecentralizedAverager average one tensor with the other peers.

Nothing in it knows about Squall. It reads the launcher's usual variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) and rendezvous the way many torchrun-launched scripts do, through
torch.distributed's TCPStore on rank 0: rank 0 starts the DHT and publishes its multiaddresses there,
the others read them and join. Every peer starts with the tensor ``[rank] * size`` and averages it;
after each round it prints ``round R error E`` (E: how far its tensor is from the exact mean).

    squall run --workers 4 --profile wan-50ms-100mbit --requirements requirements.txt \
        --metric 'error=error (\S+)' --target 'error<=1e-6' -- python peer.py
"""

import argparse
import os
import time

import hivemind
import torch
from hivemind.averaging import DecentralizedAverager
from torch.distributed import TCPStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024, help="elements of the averaged tensor")
    parser.add_argument("--port", type=int, default=0, help="the DHT's TCP port (0: MASTER_PORT + 1)")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master, master_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    port = args.port or master_port + 1
    me = os.environ.get("SQUALL_PEERS", "").split(",")[rank] if os.environ.get("SQUALL_PEERS") else master
    store = TCPStore(master, master_port, world, is_master=rank == 0, timeout=__import__("datetime").timedelta(
        seconds=120))
    dht_args = {"host_maddrs": [f"/ip4/0.0.0.0/tcp/{port}"], "announce_maddrs": [f"/ip4/{me}/tcp/{port}"],
                "start": True}
    if rank == 0:
        dht = hivemind.DHT(**dht_args)
        store.set("maddrs", " ".join(str(m) for m in dht.get_visible_maddrs()))
    else:
        dht = hivemind.DHT(initial_peers=store.get("maddrs").decode().split(), **dht_args)
    tensor = torch.full((args.size,), float(rank))
    averager = DecentralizedAverager([tensor], dht, prefix="squall_example", target_group_size=world,
                                     min_group_size=world, min_matchmaking_time=3.0, request_timeout=2.0,
                                     start=True)
    exact = (world - 1) / 2
    store.add("ready", 1)
    while int(store.add("ready", 0)) < world:  # every peer's averager is up before the first round
        time.sleep(0.1)
    for r in range(1, args.rounds + 1):
        t0 = time.monotonic()
        group = averager.step(timeout=60)
        with averager.get_tensors() as tensors:
            error = float((tensors[0] - exact).abs().max())
        print(f"round {r} group {len(group) if group else 0} error {error:.3g} took {time.monotonic() - t0:.2f}",
              flush=True)
    store.add("done", 1)
    while int(store.add("done", 0)) < world:  # nobody leaves while another still averages with it
        time.sleep(0.1)
    averager.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
