"""Control protocol: the JSON-lines server and client over a real Unix socket, and the daemon's
command handling for requests that need no namespace (no root needed)."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.shaping.nfqueue.config import DaemonConfig, LinkParams
from squall.shaping.nfqueue.control import ControlClient
from squall.shaping.nfqueue.daemon import Daemon
from squall.shaping.nfqueue.errors import ConfigError, ControlError
from squall.shaping.nfqueue.server import ControlServer


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Name: served. Scope: function. A ControlServer answering on a thread; yields (path, requests)."""
    path = str(tmp_path / "ctl.sock")
    seen: list[dict[str, Any]] = []

    def handler(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        if request.get("cmd") == "boom":
            raise ConfigError("bad thing")
        return {"ok": True, "echo": request}

    epoll = select.epoll()
    server = ControlServer(path, handler, epoll)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for fd, _ in epoll.poll(0.05):
                server.on_readable(fd)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield path, seen
    stop.set()
    thread.join()
    server.close()
    epoll.close()
    assert not Path(path).exists()


def test_requests_and_answers_in_order(served: tuple[str, list[dict[str, Any]]]) -> None:
    path, seen = served
    with ControlClient(path) as client:
        assert client.request({"cmd": "ping"})["echo"] == {"cmd": "ping"}
        answer = client.set_links([("ns", 1, LinkParams(delay_us=5))], seed=3)
        link = answer["echo"]["links"][0]
        assert link["link"]["delay_us"] == 5 and link["seed"] == 3 and link["namespace"] == "ns"
    assert [r["cmd"] for r in seen] == ["ping", "set_links"]


def test_handler_errors_become_answers(served: tuple[str, list[dict[str, Any]]]) -> None:
    path, _ = served
    with ControlClient(path) as client:
        with pytest.raises(ControlError, match="bad thing"):
            client.request({"cmd": "boom"})
        assert client.ping()["ok"]  # the connection survives


def test_connect_to_missing_socket(tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="cannot connect"):
        ControlClient(str(tmp_path / "nothing.sock"))


def test_daemon_commands_without_namespaces(tmp_path: Path) -> None:
    daemon = Daemon(DaemonConfig(control_socket=str(tmp_path / "d.sock")))
    assert daemon.handle({"cmd": "ping"})["queues"] == 0
    assert not daemon.handle({"cmd": "fly"})["ok"]
    with pytest.raises(ConfigError, match="no queue"):
        daemon.handle({"cmd": "set_links", "links": [{"namespace": "x", "queue": 1, "link": {}}]})
    with pytest.raises(ConfigError, match="list"):
        daemon.handle({"cmd": "set_links"})
    stats = daemon.handle({"cmd": "stats"})
    assert stats["queues"] == [] and stats["lateness"]["count"] == 0
    assert daemon.handle({"cmd": "shutdown"})["ok"]
    daemon.run()  # stop was requested: shuts down at once
