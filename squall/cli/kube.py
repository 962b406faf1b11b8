"""``squall kube render``: the Kubernetes manifests of one run, as YAML (see docs/kubernetes.md).

Rendering only: Squall does not talk to a Kubernetes API server yet. The manifests come from
:func:`squall.cluster.kubernetes.render`; a bad input is a usage error (exit 2) naming the key.
"""

from __future__ import annotations

import argparse
import secrets
import sys

from squall.cluster.kubernetes import KubeInputs, render, to_yaml
from squall.cluster.ownership import new_run_id

EXIT_OK = 0  # the value of squall.cli.main's code


def cmd_render(args: argparse.Namespace) -> int:
    """Print the manifests; a fresh token unless ``--token`` is given (or ``SQUALL_KUBE_TOKEN``)."""
    inputs = KubeInputs(
        run_id=args.run_id or new_run_id(), workers=args.workers, image=args.image,
        token=args.token or secrets.token_urlsafe(32), namespace=args.namespace or "",
        agent_image=args.agent_image or "", agent_port=args.agent_port, cpus=args.cpus, memory=args.memory,
        ttl_s=args.ttl, owner_uid=args.owner_uid or "", runtime_socket=args.runtime_socket,
    )
    sys.stdout.write(to_yaml(render(inputs)))
    return EXIT_OK


def add_subparser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``kube render`` on a parent command's sub-parsers."""
    kube = subparsers.add_parser("kube", help="Kubernetes manifests of a run (rendered, not applied)")
    sub = kube.add_subparsers(dest="kube_command", required=True)
    p = sub.add_parser("render", help="print the manifests of one run as YAML (docs/kubernetes.md)")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--image", required=True, help="the worker image (it must contain the code)")
    p.add_argument("--run-id", default="", help="names the objects (default: a new random id)")
    p.add_argument("--namespace", default="", help="an existing namespace (default: the run's own, rendered)")
    p.add_argument("--agent-image", default="", help="the node agent's image (default: the worker image)")
    p.add_argument("--agent-port", type=int, default=29400, help="the agents' TCP port on each node (host network)")
    p.add_argument("--cpus", type=float, default=1.0, help="cores per worker (request = limit)")
    p.add_argument("--memory", default="1Gi", help="memory per worker, a Kubernetes quantity")
    p.add_argument("--ttl", type=int, default=600, help="seconds the finished Job (and all it owns) is kept")
    p.add_argument("--owner-uid", default="", help="the Job's uid once created: adds ownerReferences to the rest")
    p.add_argument("--runtime-socket", default="/run/containerd/containerd.sock",
                   help="the container runtime's socket on the nodes")
    p.add_argument("--token", default="", help="the harness-agent token (default: a fresh random one)")
    p.set_defaults(func=cmd_render)
