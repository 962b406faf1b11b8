"""Kubernetes manifests for one Squall run, rendered from a frozen, validated input (pure: no cluster).

What a run needs on Kubernetes (docs/kubernetes.md says why each piece is shaped the way it is):

* the **workers** as one Indexed Job (``completionMode: Indexed``, completions = parallelism = the
  worker count, no retries: churn belongs to the profile), created *suspended* so nothing runs
  before the node agent and the rest exist; each pod gets its rank from its completion index and a
  stable DNS name ``<job>-<index>.<service>`` through a headless Service;
* the **node agent** (the one the swarm engine runs as a global service) as a privileged DaemonSet
  with ``hostPID`` and ``hostNetwork``, the host's ``/proc`` and the container runtime's socket
  mounted: it checks each worker's container id against ``/proc/<pid>/cgroup`` before entering
  ``/proc/<pid>/ns/net`` to shape its links, and reaches each worker's agent socket through
  ``/proc/<pid>/root``, so control traffic never crosses a shaped link;
* the agent's **ServiceAccount**, a Role to read the pods of the namespace and its RoleBinding;
* the **auth token** between harness and agents as a Secret, mounted read-only;
* cleanup through an **owner object**: the Job has ``ttlSecondsAfterFinished``; every other namespaced
  object has an ``ownerReference`` to it (given the Job's uid, known once it exists), so the TTL or
  deleting the Job removes everything. A run's own namespace (the default) is labelled for
  privileged pods and carries ``squall.run``; a namespace given by name is not rendered.

Every object carries ``squall.run=<run id>``. :func:`render` returns plain dicts in the order to
apply them; :func:`to_yaml` joins them into one multi-document YAML stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from squall.cluster.errors import ClusterSpecError
from squall.cluster.ownership import LABEL_RUN

MAX_WORKERS = 1000
MAX_TTL_S = 7 * 24 * 3600
#: The swarm engine's node agent; on Kubernetes it finds workers through the API (docs/kubernetes.md).
AGENT_MODULE = "squall.cluster.swarm.node_agent"
RUN_MOUNT = "/squall/run"  # as in the local engine: the worker agent's socket and job outputs
PROC_MOUNT = "/host/proc"
RUNTIME_MOUNT = "/host/run/runtime.sock"
TOKEN_DIR = "/etc/squall/token"
PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/audit": "privileged",
              "pod-security.kubernetes.io/warn": "privileged"}
#: Per-namespace sysctls of the workers (the local engine's TCP buffers). The kubelet treats them as
#: unsafe: it must list them in --allowed-unsafe-sysctls (docs/kubernetes.md).
TCP_BUFFER_MAX = 64 << 20

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RUN_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{32,256}$")


class KubeSpecError(ClusterSpecError):
    """An input of :class:`KubeInputs` is not allowed; the message names the key, the value and what is."""


def _bad(key: str, value: object, allowed: str) -> KubeSpecError:
    return KubeSpecError(f"{key}={value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class KubeInputs:
    """What the manifests of one run depend on; every field is checked when the object is made."""

    run_id: str  # names the objects; lowercase letters, digits, '-'; at most 20 characters
    workers: int
    image: str  # the worker image; it must hold the code (no bind mount from the harness's host)
    token: str = field(repr=False)  # the harness <-> agent token, 32-256 of [A-Za-z0-9_-]
    namespace: str = ""  # "" = the run's own namespace squall-<run id>, rendered and labelled privileged
    agent_image: str = ""  # "" = the worker image
    cpus: float = 1.0  # per worker, request = limit
    memory: str = "1Gi"  # per worker, request = limit (a Kubernetes quantity)
    agent_port: int = 29400  # the agents' TCP port on each node's own address (host network)
    ttl_s: int = 600  # ttlSecondsAfterFinished of the Job (the owner of everything else)
    owner_uid: str = ""  # the Job's uid once it exists: the other objects then get ownerReferences
    runtime_socket: str = "/run/containerd/containerd.sock"  # the node's container runtime socket

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not _RUN_ID.match(self.run_id):
            raise _bad("run_id", self.run_id, "1-20 of lowercase letters, digits and '-', not starting or ending "
                       "with '-' (it names the objects and the pods' host names)")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= MAX_WORKERS:
            raise _bad("workers", self.workers, f"an integer in 1..{MAX_WORKERS}")
        for key in ("image", "agent_image"):
            value = getattr(self, key)
            if (value or key == "image") and (not isinstance(value, str) or not _IMAGE.match(value)):
                raise _bad(key, value, "an image reference such as registry.example/squall-worker:1a2b (no spaces)")
        if not isinstance(self.token, str) or not _TOKEN.match(self.token):
            raise _bad("token", "<hidden>", "32-256 characters of A-Z, a-z, 0-9, '_' and '-'")
        if self.namespace and (not _LABEL.match(self.namespace) or len(self.namespace) > 63):
            raise _bad("namespace", self.namespace, "a DNS label: 1-63 of lowercase letters, digits and '-'")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int | float) or not 0 < self.cpus <= 256:
            raise _bad("cpus", self.cpus, "a number of cores in (0, 256]")
        if not isinstance(self.memory, str) or not _QUANTITY.match(self.memory):
            raise _bad("memory", self.memory, "a Kubernetes quantity such as 512Mi or 1Gi")
        if isinstance(self.ttl_s, bool) or not isinstance(self.ttl_s, int) or not 0 <= self.ttl_s <= MAX_TTL_S:
            raise _bad("ttl_s", self.ttl_s, f"whole seconds in 0..{MAX_TTL_S}")
        if isinstance(self.agent_port, bool) or not isinstance(self.agent_port, int) or not (
                1024 <= self.agent_port <= 65535):
            raise _bad("agent_port", self.agent_port, "a TCP port in 1024..65535 free on every node")
        if self.owner_uid and not _UID.match(self.owner_uid):
            raise _bad("owner_uid", self.owner_uid, "the Job's metadata.uid, a lowercase UUID, or '' before it exists")
        if not isinstance(self.runtime_socket, str) or not self.runtime_socket.startswith("/"):
            raise _bad("runtime_socket", self.runtime_socket, "an absolute path on the nodes")

    @property
    def ns(self) -> str:
        """The namespace every namespaced object goes in."""
        return self.namespace or f"squall-{self.run_id}"

    @property
    def job_name(self) -> str:
        return f"squall-{self.run_id}-workers"

    @property
    def service_name(self) -> str:
        return f"squall-{self.run_id}"

    @property
    def agent_name(self) -> str:
        return f"squall-{self.run_id}-agent"

    @property
    def secret_name(self) -> str:
        return f"squall-{self.run_id}-token"


def labels(inputs: KubeInputs, component: str) -> dict[str, str]:
    """The labels of every object: the run, the product, the part."""
    return {LABEL_RUN: inputs.run_id, "app.kubernetes.io/part-of": "squall", "app.kubernetes.io/component": component}


def _meta(inputs: KubeInputs, name: str, component: str, *, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": inputs.ns, "labels": labels(inputs, component)}
    if owned and inputs.owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": inputs.job_name,
                                    "uid": inputs.owner_uid, "blockOwnerDeletion": True, "controller": False}]
    return meta


def _quantity_cpu(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def namespace(inputs: KubeInputs) -> dict[str, Any]:
    """The run's own namespace, labelled so Pod Security admits the privileged agent."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": inputs.ns, "labels": {**labels(inputs, "namespace"), **PRIVILEGED}}}


def job(inputs: KubeInputs) -> dict[str, Any]:
    """The workers: an Indexed Job, suspended until the agent is ready; it owns everything else."""
    limits = {"cpu": _quantity_cpu(inputs.cpus), "memory": inputs.memory}
    mx = str(TCP_BUFFER_MAX)
    container = {
        "name": "worker", "image": inputs.image,
        "command": ["python3", "-m", "squall.worker.agent", "--socket", f"{RUN_MOUNT}/agent.sock"],
        "env": [
            {"name": "SQUALL_RUN", "value": inputs.run_id},
            {"name": "SQUALL_NODE", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "SQUALL_WORKERS", "value": str(inputs.workers)},
            {"name": "SQUALL_PEER_DNS", "value": f"{inputs.job_name}-{{index}}.{inputs.service_name}"},
            {"name": "OMP_NUM_THREADS", "value": str(max(1, int(inputs.cpus)))},
        ],
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "run", "mountPath": RUN_MOUNT}],
    }
    pod = {
        "metadata": {"labels": labels(inputs, "worker")},
        "spec": {
            "subdomain": inputs.service_name, "restartPolicy": "Never", "automountServiceAccountToken": False,
            "enableServiceLinks": False, "terminationGracePeriodSeconds": 5,
            "securityContext": {"sysctls": [
                {"name": "net.ipv4.tcp_rmem", "value": f"4096 131072 {mx}"},
                {"name": "net.ipv4.tcp_wmem", "value": f"4096 65536 {mx}"},
            ]},
            "containers": [container],
            "volumes": [{"name": "run", "emptyDir": {}}],
        },
    }
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(inputs, inputs.job_name, "worker", owned=False),
            "spec": {"completionMode": "Indexed", "completions": inputs.workers, "parallelism": inputs.workers,
                     "backoffLimit": 0, "suspend": True, "ttlSecondsAfterFinished": inputs.ttl_s,
                     "template": pod}}


def service(inputs: KubeInputs) -> dict[str, Any]:
    """Headless: a DNS name per worker pod, no virtual IP, no load balancing."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(inputs, inputs.service_name, "worker-dns"),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {LABEL_RUN: inputs.run_id, "app.kubernetes.io/component": "worker"}}}


def secret(inputs: KubeInputs) -> dict[str, Any]:
    """The token the harness and the agents share (the swarm engine's Swarm secret)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(inputs, inputs.secret_name, "token"), "stringData": {"token": inputs.token}}


def rbac(inputs: KubeInputs) -> list[dict[str, Any]]:
    """The agent's identity: it may read the pods of this namespace (to map workers to containers)."""
    name = inputs.agent_name
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(inputs, name, "node-agent"),
         "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(inputs, name, "node-agent"),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(inputs, name, "node-agent"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": inputs.ns}]},
    ]


def daemonset(inputs: KubeInputs) -> dict[str, Any]:
    """The node agent on every node: the host's pids and network, privileged, /proc and the runtime socket."""
    selector = {LABEL_RUN: inputs.run_id, "app.kubernetes.io/component": "node-agent"}
    container = {
        "name": "agent", "image": inputs.agent_image or inputs.image,
        "command": ["python3", "-m", AGENT_MODULE],
        "env": [
            {"name": "SQUALL_RUN", "value": inputs.run_id},
            {"name": "SQUALL_AGENT_PORT", "value": str(inputs.agent_port)},
            {"name": "SQUALL_WORKERS", "value": str(inputs.workers)},
            {"name": "SQUALL_WORKER_SELECTOR", "value": f"{LABEL_RUN}={inputs.run_id},"
                                                        "app.kubernetes.io/component=worker"},
            {"name": "SQUALL_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SQUALL_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "SQUALL_HOST_PROC", "value": PROC_MOUNT},
            {"name": "SQUALL_RUNTIME_SOCKET", "value": RUNTIME_MOUNT},
            {"name": "SQUALL_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
            {"name": "SQUALL_CHECK_CGROUP", "value": "1"},  # a worker's container id must be in /proc/<pid>/cgroup
        ],
        "securityContext": {"privileged": True},  # setns into pods, tc, iptables; see docs/kubernetes.md
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "volumeMounts": [
            {"name": "proc", "mountPath": PROC_MOUNT, "readOnly": True},
            {"name": "runtime", "mountPath": RUNTIME_MOUNT},
            {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
    }
    pod = {
        "metadata": {"labels": labels(inputs, "node-agent")},
        "spec": {
            "hostPID": True, "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
            "serviceAccountName": inputs.agent_name, "terminationGracePeriodSeconds": 10,
            "tolerations": [{"operator": "Exists"}],  # every node that may run a worker
            "containers": [container],
            "volumes": [
                {"name": "proc", "hostPath": {"path": "/proc", "type": "Directory"}},
                {"name": "runtime", "hostPath": {"path": inputs.runtime_socket, "type": "Socket"}},
                {"name": "token", "secret": {"secretName": inputs.secret_name, "defaultMode": 0o400}},
            ],
        },
    }
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(inputs, inputs.agent_name, "node-agent"),
            "spec": {"selector": {"matchLabels": selector}, "template": pod,
                     "updateStrategy": {"type": "RollingUpdate"}}}


def render(inputs: KubeInputs) -> list[dict[str, Any]]:
    """Every object of the run, in the order to apply them (the owner, the Job, right after the namespace)."""
    objects: list[dict[str, Any]] = [namespace(inputs)] if not inputs.namespace else []
    objects += [job(inputs), secret(inputs), *rbac(inputs), daemonset(inputs), service(inputs)]
    return objects


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """One multi-document YAML stream, keys in the order written."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
