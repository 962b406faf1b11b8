"""Helper process of the teardown tests: start a cluster, print its run id, wait to be signalled."""

from __future__ import annotations

import signal
import sys
import time

from squall.cluster import Cluster, ClusterSpec


def main() -> None:
    # Ctrl-C raises KeyboardInterrupt even when the test runner was started in the background by a
    # non-interactive shell, which starts its children with SIGINT ignored (POSIX), as Python keeps it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with Cluster(ClusterSpec(workers=int(sys.argv[1]), cpus=0.5, memory="512m")) as cluster:
        pids = " ".join(str(n.pid) for n in cluster.nodes)
        sys.stdout.write(f"READY {cluster.run_id} {cluster.state_dir} {pids}\n")
        sys.stdout.flush()
        time.sleep(600)


if __name__ == "__main__":
    main()
