"""The Kubernetes manifests squall renders (squall/cluster/kubernetes.py, ``squall kube render``).

No Kubernetes server can run here, so these check what can be checked on paper: the objects, their
labels, who is privileged, the Indexed Job's counts, ownership and TTL, the selectors that must
match, names within DNS limits, and that every bad input is refused naming its key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from squall.cli.main import main
from squall.cluster.errors import ClusterSpecError
from squall.cluster.kubernetes import AGENT_MODULE, KubeInputs, KubeSpecError, render, to_yaml

TOKEN = "t" * 40


def inputs(**kw: Any) -> KubeInputs:
    base: dict[str, Any] = {"run_id": "ab12cd34ef", "workers": 8, "image": "registry.example/squall-worker:1a2b",
                            "token": TOKEN}
    base.update(kw)
    return KubeInputs(**base)


def by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def walk(node: Any, key: str) -> Iterator[Any]:
    """Every value stored under ``key`` anywhere in ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v, key)


def test_the_objects_of_a_run_in_apply_order() -> None:
    kinds = [o["kind"] for o in render(inputs())]
    assert kinds == ["Namespace", "Job", "Secret", "ServiceAccount", "Role", "RoleBinding", "DaemonSet", "Service"]


@pytest.mark.parametrize("namespace", ["", "research"])
def test_every_object_is_labelled_with_the_run_and_in_one_namespace(namespace: str) -> None:
    objects = render(inputs(namespace=namespace))
    expected_ns = namespace or "squall-ab12cd34ef"
    for o in objects:
        assert o["metadata"]["labels"]["squall.run"] == "ab12cd34ef", o["kind"]
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == expected_ns, o["kind"]
    for template in walk(objects, "template"):  # pods of the Job and the DaemonSet too
        assert template["metadata"]["labels"]["squall.run"] == "ab12cd34ef"
    assert ("Namespace" in by_kind(objects)) == (namespace == "")


def test_the_runs_own_namespace_admits_privileged_pods() -> None:
    ns = by_kind(render(inputs()))["Namespace"][0]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_only_the_agent_has_host_pid_host_network_and_privilege() -> None:
    kinds = by_kind(render(inputs()))
    agent = kinds["DaemonSet"][0]["spec"]["template"]["spec"]
    assert agent["hostPID"] is True and agent["hostNetwork"] is True
    assert [c["securityContext"]["privileged"] for c in agent["containers"]] == [True]
    mounts = {v["name"]: v for v in agent["volumes"]}
    assert mounts["proc"]["hostPath"]["path"] == "/proc"
    assert mounts["runtime"]["hostPath"]["type"] == "Socket"
    assert mounts["token"]["secret"]["secretName"] == kinds["Secret"][0]["metadata"]["name"]
    env = {e["name"]: e for e in agent["containers"][0]["env"]}
    assert env["SQUALL_CHECK_CGROUP"]["value"] == "1"
    assert env["SQUALL_HOST_PROC"]["value"] == "/host/proc"
    assert "/host/proc" in {m["mountPath"] for m in agent["containers"][0]["volumeMounts"]}
    assert agent["containers"][0]["command"][-1] == AGENT_MODULE
    assert importlib.util.find_spec(AGENT_MODULE) is not None  # the swarm engine's agent exists
    everything_else = [o for o in render(inputs()) if o["kind"] != "DaemonSet"]
    assert list(walk(everything_else, "hostPID")) == []
    assert list(walk(everything_else, "hostNetwork")) == []
    assert list(walk(everything_else, "privileged")) == []
    worker = kinds["Job"][0]["spec"]["template"]["spec"]["containers"][0]
    assert worker["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("workers", [1, 8, 256])
def test_the_workers_are_an_indexed_job_of_that_many_completions(workers: int) -> None:
    kinds = by_kind(render(inputs(workers=workers, ttl_s=123, cpus=0.5, memory="512Mi")))
    spec = kinds["Job"][0]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == workers
    assert spec["backoffLimit"] == 0 and spec["suspend"] is True and spec["ttlSecondsAfterFinished"] == 123
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    resources = pod["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "500m", "memory": "512Mi"}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["SQUALL_WORKERS"]["value"] == str(workers)
    assert "job-completion-index" in env["SQUALL_NODE"]["valueFrom"]["fieldRef"]["fieldPath"]


def test_selectors_match_their_pods_and_dns_names_fit() -> None:
    kinds = by_kind(render(inputs(workers=1000, run_id="a" * 20)))
    job, service, agent = kinds["Job"][0], kinds["Service"][0], kinds["DaemonSet"][0]
    worker_labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= worker_labels.items()
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert agent["spec"]["selector"]["matchLabels"].items() <= agent["spec"]["template"]["metadata"]["labels"].items()
    # an Indexed Job's pod host name is <job name>-<index>: a DNS label (<= 63) for the last index too
    assert len(f"{job['metadata']['name']}-{999}") <= 63
    for o in render(inputs(workers=1000, run_id="a" * 20)):
        assert len(o["metadata"]["name"]) <= 63


def test_the_job_owns_everything_else_once_its_uid_is_known() -> None:
    assert list(walk(render(inputs()), "ownerReferences")) == []  # before the Job exists: labels only
    uid = str(uuid.UUID(int=7))
    objects = render(inputs(owner_uid=uid))
    job_name = by_kind(objects)["Job"][0]["metadata"]["name"]
    for o in objects:
        refs = o["metadata"].get("ownerReferences")
        if o["kind"] in ("Namespace", "Job"):
            assert refs is None, o["kind"]  # cluster-scoped / the owner itself
        else:
            assert refs == [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid,
                             "blockOwnerDeletion": True, "controller": False}], o["kind"]


def test_the_token_is_the_secrets_and_appears_nowhere_else() -> None:
    objects = render(inputs())
    assert by_kind(objects)["Secret"][0]["stringData"] == {"token": TOKEN}
    others = [o for o in objects if o["kind"] != "Secret"]
    assert TOKEN not in to_yaml(others)
    assert TOKEN not in repr(inputs())


def test_yaml_round_trips() -> None:
    objects = render(inputs(owner_uid=str(uuid.UUID(int=1))))
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.parametrize(("key", "value"), [
    ("run_id", "Has_Upper"), ("run_id", ""), ("run_id", "a" * 21), ("run_id", "-ab"),
    ("workers", 0), ("workers", 1001), ("workers", True), ("workers", 2.0),
    ("image", ""), ("image", "has space:1"), ("agent_image", "bad image"),
    ("namespace", "Not-DNS"), ("namespace", "a" * 64),
    ("cpus", 0), ("cpus", -1.0), ("cpus", 1000.0),
    ("memory", "1g "), ("memory", "lots"),
    ("ttl_s", -1), ("ttl_s", 10**9),
    ("agent_port", 80), ("agent_port", 70000),
    ("owner_uid", "not-a-uid"), ("runtime_socket", "relative/sock"),
])
def test_bad_inputs_are_refused_naming_the_key_and_value(key: str, value: Any) -> None:
    with pytest.raises(KubeSpecError) as info:
        inputs(**{key: value})
    assert str(info.value).startswith(f"{key}={value!r} is not allowed: ")
    assert issubclass(KubeSpecError, ClusterSpecError)


def test_a_bad_token_is_refused_without_showing_it() -> None:
    with pytest.raises(KubeSpecError, match="token=") as info:
        inputs(token="short-secret")
    assert "short-secret" not in str(info.value)


def test_inputs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs().workers = 3  # type: ignore[misc]


def test_cli_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kube", "render", "--workers", "3", "--image", "img:1", "--run-id", "r7", "--namespace", "lab"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objects][:2] == ["Job", "Secret"]
    assert by_kind(objects)["Job"][0]["spec"]["completions"] == 3
    assert {o["metadata"]["labels"]["squall.run"] for o in objects} == {"r7"}
    assert len(by_kind(objects)["Secret"][0]["stringData"]["token"]) >= 32  # a fresh one


def test_cli_bad_input_is_a_usage_error(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["kube", "render", "--workers", "0", "--image", "img:1"]) == 2
    assert "workers=0 is not allowed" in caplog.text
