r"""A plain DDP training script written for torchrun: nothing in it knows about Squall.

    torchrun --nproc-per-node 4 train.py                       # on one machine
    squall run --workers 4 --profile thin-20mbit \
        --metric 'loss=loss (\S+)' --target 'loss<=1.0' -- python train.py   # on a bad network
    squall run ... -- python train.py --hook powersgd           # PyTorch's own PowerSGD hook

env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the launcher), the gloo backend,
a small MLP on a synthetic classification task (every rank draws its own shard from the same
teacher), and one line per step: ``step N loss X``. ``--hook powersgd`` registers
torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook (rank-``--rank`` low-rank
gradients with error feedback, after ``--start-iter`` steps of plain all-reduce).
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hook", choices=["none", "powersgd"], default="none")
    parser.add_argument("--rank", type=int, default=2, help="PowerSGD's matrix approximation rank")
    parser.add_argument("--start-iter", type=int, default=2, help="PowerSGD starts after this many steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    features, classes = 64, 10
    teacher = nn.Sequential(nn.Linear(features, 128), nn.Tanh(), nn.Linear(128, classes))
    model = nn.Sequential(nn.Linear(features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, classes))
    # bucket_cap_mb given explicitly: every gradient in one bucket (the default gives the first bucket 1 MiB).
    # PowerSGD's hook issues its all-reduces from future callbacks; with two buckets in flight, gloo can
    # receive them in a different order on different ranks (a collective mismatch that aborts or hangs).
    ddp = DistributedDataParallel(model, bucket_cap_mb=25)
    if args.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                                            start_powerSGD_iter=args.start_iter)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)
    t0 = time.monotonic()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, features, generator=data)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        loss = functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} time {time.monotonic() - t0:.3f}", flush=True)
    # A clean end for gloo: every rank past its last collective (the barrier queues behind them), then
    # DDP's reducer and the hook's state, which hold the group, released before the group is destroyed.
    # Without this a rank could abort in C++ at exit ("terminate called without an active exception").
    dist.barrier()
    del ddp, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
