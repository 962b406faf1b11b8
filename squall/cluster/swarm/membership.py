"""Being in a swarm: use the one this engine is in, or initialise one and leave it again afterwards.

A swarm the engine was already part of is used as it is and never left. When the engine is in
none, :func:`join_or_init` runs ``swarm init`` with this host's address and records that Squall
did it, with the runs using it, in :func:`record_path`. :func:`release` drops a run
from that record and, when no live run is left in it, leaves the swarm and removes the
``docker_gwbridge`` network that leaving keeps. ``squall gc`` calls :func:`release` for dead runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from squall.cluster.engine import ENGINE_ERRORS
from squall.cluster.errors import ClusterError
from squall.cluster.ownership import Owner, state_root

logger = logging.getLogger(__name__)

RECORD = "swarm-init.json"
GWBRIDGE = "docker_gwbridge"


def record_path() -> Path:
    """Where Squall notes that it initialised the swarm, and which runs use it.

    One place per machine (not per ``SQUALL_STATE_DIR``): runs with different state directories
    share the engine, so they must share this record too.
    """
    if os.geteuid() == 0:
        return Path("/var/tmp") / f"squall-{RECORD}"
    return Path.home() / ".cache" / f"squall-{RECORD}"


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    path = record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the directory is the lock: no file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def default_route_address() -> str:
    """The IPv4 address of the interface that carries this host's default route."""
    iface = None
    with contextlib.suppress(OSError), open("/proc/net/route") as routes:
        for line in routes.readlines()[1:]:
            fields = line.split()
            if len(fields) > 2 and fields[1] == "00000000":
                iface = fields[0]
                break
    if iface is not None:
        import psutil

        for addr in psutil.net_if_addrs().get(iface, []):
            if addr.family == socket.AF_INET:
                return str(addr.address)
    raise ClusterError("cannot tell this host's address (no default route); initialise the swarm yourself "
                       "with 'docker swarm init --advertise-addr <address>'")


def swarm_state(client: Any) -> str:
    """The engine's swarm state: 'inactive', 'active', 'pending', 'error' or 'locked'."""
    return str(client.info().get("Swarm", {}).get("LocalNodeState", "inactive"))


def is_manager(client: Any) -> bool:
    """Whether this engine manages the swarm (services can only be created on a manager)."""
    return bool(client.info().get("Swarm", {}).get("ControlAvailable"))


def join_or_init(client: Any, run_id: str) -> bool:
    """Make sure the engine is a swarm manager; returns True when Squall initialised the swarm.

    :raises ClusterError: the engine is in a swarm but not as a manager, or ``swarm init`` fails.
    """
    with _locked() as path:
        record = _read(path)
        state = swarm_state(client)
        if state == "active" and record is None:
            if not is_manager(client):
                raise ClusterError("this Docker engine is a swarm worker, not a manager: point DOCKER_HOST at a "
                                   "manager to run Squall's swarm engine")
            return False  # someone else's swarm: used as it is
        if state != "active":
            address = default_route_address()
            try:
                client.swarm.init(advertise_addr=address, listen_addr=f"{address}:2377")
            except ENGINE_ERRORS as exc:
                raise ClusterError(f"docker swarm init --advertise-addr {address} failed: {exc}") from exc
            logger.info("initialised a one-node swarm on %s (Squall will leave it when its runs end)", address)
            record = {"address": address, "runs": {}}
        assert record is not None
        record["runs"][run_id] = Owner.me().labels(run_id, state_root() / run_id)
        path.write_text(json.dumps(record))
        return True


def release(client: Any, run_id: str | None, *, force: bool = False) -> bool:
    """Drop ``run_id`` from the record; leave the swarm Squall made once no live run uses it.

    With ``run_id=None`` only dead runs are dropped (gc). ``force`` leaves even with live runs
    recorded (``squall gc --all``). Returns True when the swarm was left.
    """
    with _locked() as path:
        record = _read(path)
        if record is None:
            return False
        runs: dict[str, dict[str, str]] = record.get("runs", {})
        if run_id is not None:
            runs.pop(run_id, None)
        for other, labels in list(runs.items()):
            owner = Owner.from_labels(labels)
            if owner is None or not owner.alive():
                runs.pop(other)
        if runs and not force:
            path.write_text(json.dumps(record))
            return False
        try:
            if swarm_state(client) == "active":
                client.swarm.leave(force=True)
            with contextlib.suppress(*ENGINE_ERRORS):
                for net in client.networks.list(names=[GWBRIDGE]):
                    if net.name == GWBRIDGE:
                        net.remove()
        except ENGINE_ERRORS as exc:
            raise ClusterError(f"leaving the swarm Squall initialised failed: {exc}") from exc
        path.unlink(missing_ok=True)
        logger.info("left the swarm Squall had initialised and removed %s", GWBRIDGE)
        return True

