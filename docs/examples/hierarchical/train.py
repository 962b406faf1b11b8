r"""Hierarchical data parallelism, HSDP-style: gradients averaged inside each node first, then across nodes by shards.

    torchrun --nnodes 2 --nproc-per-node 2 ... train.py                    # two machines of two GPUs each
    squall run --workers 2 --nproc-per-node 2 --profile thin-20mbit \
        --metric 'loss=loss (\S+)' --agree params -- python train.py       # two nodes on a thin network

Nothing in it knows about Squall: it reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR...) and uses gloo. Each step, with K ranks per node and a gradient of S
bytes on every rank:

1. inside the node, its K ranks all-reduce the whole gradient (the fast bus: under Squall, the
   container's loopback);
2. between nodes, local rank L all-reduces shard L (S / K bytes) with local rank L of every other node:
   the only traffic on the slow links, split across the node's K ranks;
3. inside the node, an all-gather of the K averaged shards gives every rank the whole average.

``--flat`` does one all-reduce over all ranks instead (what DDP does): its ring crosses the slow links
whatever the placement. Every rank prints ``step N loss X`` each step and, at the end, ``params H`` (a
digest of its parameters: every rank must end with the same one) and ``payload inside X between Y``:
the bytes of the tensors it gave to collectives inside its node and across nodes.
"""

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional


def groups(nodes: int, nproc: int) -> tuple[list[object], list[object]]:
    """Every node's group and every local rank's cross-node group (every rank creates all of them, in order)."""
    local = [dist.new_group(list(range(n * nproc, (n + 1) * nproc))) for n in range(nodes)]
    across = [dist.new_group([n * nproc + k for n in range(nodes)]) for k in range(nproc)]
    return local, across


def average(grad: torch.Tensor, *, flat: bool, mine: object, across: object, nproc: int,
            local_rank: int) -> tuple[torch.Tensor, int, int]:
    """The sum of every rank's ``grad``, and the payload bytes given to collectives inside the node and across."""
    if flat:
        dist.all_reduce(grad)
        return grad, 0, grad.numel() * 4
    dist.all_reduce(grad, group=mine)  # 1. inside the node
    shards = list(grad.chunk(nproc))
    shard = shards[local_rank].clone()
    dist.all_reduce(shard, group=across)  # 2. shard L across nodes
    dist.all_gather(shards, shard, group=mine)  # 3. the whole average, inside the node
    grad = torch.cat(shards)
    return grad, 2 * grad.numel() * 4, shard.numel() * 4


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--flat", action="store_true", help="one all-reduce over every rank (as DDP does)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    nodes, node = world // nproc, rank // nproc
    local_groups, across_groups = groups(nodes, nproc)
    mine, across = local_groups[node], across_groups[local_rank]

    torch.manual_seed(args.seed)
    features, classes = 64, 10
    teacher = nn.Sequential(nn.Linear(features, 128), nn.Tanh(), nn.Linear(128, classes))
    model = nn.Sequential(nn.Linear(features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, classes))
    params = list(model.parameters())
    size = sum(p.numel() for p in params)
    padded = -(-size // nproc) * nproc  # a multiple of K: K equal shards
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)
    inside = between = 0
    t0 = time.monotonic()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, features, generator=data)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        loss = functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        grad = torch.zeros(padded)
        grad[:size] = torch.cat([p.grad.reshape(-1) for p in params])
        grad, here, there = average(grad, flat=args.flat, mine=mine, across=across, nproc=nproc,
                                   local_rank=local_rank)
        inside, between = inside + here, between + there
        grad /= world
        offset = 0
        for p in params:
            p.grad.copy_(grad[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} time {time.monotonic() - t0:.3f}", flush=True)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in params)).hexdigest()[:16]
    print(f"params {digest}", flush=True)
    print(f"payload inside {inside} between {between}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
