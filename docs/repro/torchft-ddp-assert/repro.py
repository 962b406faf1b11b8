"""torchft 0.2.0: a replica that dies during an all-reduce crashes a surviving replica's backward.

Run with torchft==0.2.0 and torch (CPU is enough), on one machine, no GPU, no network:

    python repro.py

Two replica groups of one process each train a small model with torchft's DistributedDataParallel
and Optimizer against one lighthouse. Once both have taken 5 steps together, replica 1 exits after a forward
pass, while replica 0 waits in that step's all-reduce. Expected (torchft's Manager documents that a failed collective is
reported and the step is not committed): replica 0's ``loss.backward()`` returns, ``optimizer.step()``
does not commit, and replica 0 goes on alone to step 40. Observed: gloo's read error is logged by
``_ManagedWork.wait`` ("got exception waiting for work"), then ``DistributedDataParallel._comm_hook``
fails ``assert fut._fut`` and replica 0's backward raises AssertionError.
"""

import multiprocessing
import os
import sys
import time
from datetime import timedelta

import torch
from torch import nn
from torch.distributed import TCPStore
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
from torchft.coordination import LighthouseServer

STEPS = 40
DIES_AFTER = 5  # steps that both replicas took part in


def replica(index: int, lighthouse: str) -> None:
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    timeout = timedelta(seconds=10)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, timeout=timeout,
        load_state_dict=model.load_state_dict, state_dict=model.state_dict,
        replica_id=f"replica{index}", lighthouse_addr=lighthouse, hostname="localhost", store_addr="localhost",
        store_port=store.port, rank=0, world_size=1,
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    together = 0
    while manager.current_step() < STEPS:
        optimizer.zero_grad()
        loss = ddp(torch.randn(4, 8)).pow(2).mean()
        if index == 1 and together == DIES_AFTER:
            time.sleep(1.0)  # replica 0 is in this step's all-reduce by now
            print(f"replica 1: exiting in the middle of step {manager.current_step()}", flush=True)
            os._exit(1)
        try:
            loss.backward()
        except AssertionError:
            print(f"replica {index}: BUG: backward raised AssertionError at step {manager.current_step()} "
                  f"after a peer died (participants {manager.num_participants()})", flush=True)
            raise
        optimizer.step()
        together += manager.num_participants() == 2
        time.sleep(0.1)
    print(f"replica {index}: reached step {manager.current_step()} (expected)", flush=True)
    manager.shutdown(wait=False)


def main() -> int:
    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=2000)
    lighthouse = "http://localhost:" + server.address().rsplit(":", 1)[1]
    procs = [multiprocessing.get_context("spawn").Process(target=replica, args=(i, lighthouse))
             for i in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    server.shutdown()
    survivor = procs[0].exitcode
    print(f"replica 0 exit code {survivor}: {'the bug' if survivor != 0 else 'no bug'}", flush=True)
    return 0 if survivor == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
