"""A program that goes wrong on purpose, to see what Squall reports: a crash, a hang, or silence.

    python faulty.py crash --rank 2 --after 3   # rank 2 raises after 3 steps, the others train on
    python faulty.py hang --rank 1 --after 3    # rank 1 stops answering (and ignores SIGTERM)
    python faulty.py quiet                       # every rank runs and exits 0 but prints no figure
    python faulty.py steady                      # nothing goes wrong (to watch what churn does to it)

The other ranks print ``step N loss X`` every ``--period`` seconds for ``--steps`` steps; every rank
first prints ``rank R restart K`` (K: ``TORCHELASTIC_RESTART_COUNT``, how often it was restarted).
"""

import argparse
import os
import signal
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["crash", "hang", "quiet", "steady"])
    parser.add_argument("--rank", type=int, default=1, help="the rank that goes wrong")
    parser.add_argument("--after", type=int, default=3, help="steps before it does")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--period", type=float, default=0.1)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    print(f"rank {rank} restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", flush=True)
    if args.mode == "quiet":
        print(f"rank {rank} of {os.environ['WORLD_SIZE']}: nothing to report", flush=True)
        return
    steps = args.after + 3 if args.mode == "hang" else args.steps  # in 'hang' the others end on their own
    for step in range(1, steps + 1):
        if rank == args.rank and step > args.after and args.mode != "steady":
            if args.mode == "crash":
                print(f"rank {rank}: giving up at step {step}", file=sys.stderr, flush=True)
                raise RuntimeError(f"simulated crash on rank {rank} at step {step}")
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a hung process often does not answer SIGTERM
            print(f"rank {rank}: stuck at step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        print(f"step {step} loss {2.0 / step:.4f}", flush=True)
        time.sleep(args.period)


if __name__ == "__main__":
    main()
