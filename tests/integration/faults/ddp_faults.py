"""A small DDP script (gloo, env:// as under torchrun) that goes wrong on purpose, for the fault tests.

    python ddp_faults.py steady --steps 150             # trains; every rank ends with the same parameters
    python ddp_faults.py steady --until 90              # trains until 90 s after it started
    python ddp_faults.py hang --rank 1 --after 5        # rank 1 gets stuck in a function of its own
    python ddp_faults.py diverge --rank 1               # rank 1 ends with parameters of its own

Every step prints ``step N loss X``; at the end every rank prints ``params FINGERPRINT``
(``squall.fingerprint`` of its model).
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel

import squall


def wait_for_the_checkpoint_lock() -> None:
    """Where the stuck rank stays: a lock that is never released (a function of the program's own)."""
    while True:
        time.sleep(0.5)


def _all_done(mine: bool) -> bool:
    """Whether any rank's time is up: every rank stops at the same step (a lone rank in a barrier while the
    others all-reduce would be a collective mismatch: a hang)."""
    flag = torch.tensor([1.0 if mine else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["steady", "hang", "diverge"])
    parser.add_argument("--rank", type=int, default=1, help="the rank that goes wrong")
    parser.add_argument("--after", type=int, default=5, help="steps before it does")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--period", type=float, default=0.1, help="seconds of emulated compute per step")
    parser.add_argument("--until", type=float, default=None,
                        help="train until this many seconds after the process started, whatever --steps says")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    started = time.monotonic()
    step = 0
    while step < args.steps if args.until is None else not _all_done(time.monotonic() - started >= args.until):
        step += 1
        if args.mode == "hang" and rank == args.rank and step > args.after:
            wait_for_the_checkpoint_lock()
        x = torch.randn(32, 16, generator=data)
        loss = functional.mse_loss(model(x), x[:, :4])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.period)
        print(f"step {step} loss {loss.item():.5f}", flush=True)
    if args.mode == "diverge" and rank == args.rank:
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)  # a silent divergence: the loss alone would not show it
    print(f"params {squall.fingerprint(model.module)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
