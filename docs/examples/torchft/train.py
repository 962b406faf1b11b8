r"""Fault-tolerant DDP on torchft 0.2.0's public API: every rank is a replica group of one.

    squall run --workers 4 --profile lan --requirements requirements.txt \
        --metric 'loss=loss (\S+)' -- python train.py

Rank 0 also runs torchft's lighthouse, the quorum server. Before every step each replica's Manager
asks the lighthouse for a quorum; a replica that dies, hangs or is cut off is left out of the next
quorum once its heartbeats stop, and the others go on without it. A replica that comes back (after
Squall restarts it) joins a later quorum and fetches the model from a live peer before it steps.
Each step prints ``step N loss X participants P`` (N counts committed steps); the end prints ``params FINGERPRINT``
so that ``--agree params`` can check the replicas ended alike. Only that last line is Squall's.
"""

import argparse
import logging
import os
import time
from datetime import timedelta
from urllib.parse import urlsplit

os.environ.setdefault("RUST_LOG", "warn")  # torchft's quorum service logs every quorum at info

import torch
from torch import nn
from torch.distributed import TCPStore
from torch.nn import functional
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.coordination import LighthouseServer

LIGHTHOUSE_PORT = 29510


class Transport(HTTPTransport):
    """torchft's HTTP checkpoint transport, announced at this rank's address on the shaped network.

    The stock transport announces ``socket.gethostname()``, a name the other containers cannot resolve.
    """

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host = host  # before the base class, whose constructor logs the address
        super().__init__(timeout=timeout, num_chunks=0)

    def address(self) -> str:
        port = urlsplit(super().address()).port
        return f"http://{self.host}:{port}/checkpoint/"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--period", type=float, default=0.1, help="seconds of emulated compute per step")
    parser.add_argument("--min-replicas", type=int, default=2, help="the smallest quorum that may step")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="collectives, commits and checkpoints")
    parser.add_argument("--quorum-timeout-s", type=float, default=30.0)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=5000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rank = int(os.environ["RANK"])
    peers = os.environ["SQUALL_PEERS"].split(",")
    lighthouse = None
    if rank == 0 and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        lighthouse = LighthouseServer(bind=f"0.0.0.0:{LIGHTHOUSE_PORT}", min_replicas=args.min_replicas,
                                      join_timeout_ms=args.heartbeat_timeout_ms,
                                      heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    store = TCPStore(peers[rank], 0, is_master=True, wait_for_workers=False)  # this replica group's store
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        inner.load_state_dict(state["optim"])  # type: ignore[arg-type]

    timeout = timedelta(seconds=args.timeout_s)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=args.min_replicas,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"replica{rank}",
                      lighthouse_addr=f"http://{peers[0]}:{LIGHTHOUSE_PORT}", hostname=peers[rank],
                      store_addr=peers[rank], store_port=store.port, rank=0, world_size=1, timeout=timeout,
                      quorum_timeout=timedelta(seconds=args.quorum_timeout_s),
                      checkpoint_transport=Transport(peers[rank], timeout))
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    data = torch.Generator().manual_seed(100 + rank)
    while manager.current_step() < args.steps:
        x = torch.randn(32, 16, generator=data)
        optimizer.zero_grad()  # starts this step's quorum
        loss = functional.mse_loss(ddp(x), x[:, :4])
        loss.backward()
        optimizer.step()  # commits only when every participant's step succeeded; else the step is redone
        time.sleep(args.period)
        print(f"step {manager.current_step()} loss {loss.item():.5f} participants {manager.num_participants()}",
              flush=True)
    import squall

    print(f"params {squall.fingerprint(model)}", flush=True)
    manager.shutdown(wait=False)
    if lighthouse is not None:
        time.sleep(5.0)  # the others' last quorum needs the lighthouse
        lighthouse.shutdown()


if __name__ == "__main__":
    main()
