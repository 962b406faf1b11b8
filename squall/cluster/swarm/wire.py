"""What crosses between the harness and the node agents: token-checked JSON lines, and the codecs.

One TCP connection per request: the harness sends one JSON object on one line, the agent answers
one JSON object on one line (:mod:`squall.worker.jsonline` reads and writes them); what a request
may ask is :class:`NodeCommand`. Every request carries the run's token (kept by Swarm as a secret and
mounted into the agents at /run/secrets); the agent compares it in constant time and answers
nothing useful without it. Only JSON is ever decoded here: no pickle, no eval, sizes bounded.

The agents listen on their node's own address (host network), so this control traffic never
crosses the shaped links of the overlay network the workers talk on.

The codecs turn a :class:`~squall.shaping.base.LinkState` and its link settings into plain JSON
values and back, strictly: an unknown key or a wrong type raises :class:`WireError`.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import socket
from enum import StrEnum
from typing import Any

from squall.profiles import LinkSpec, NodeLinkSpec
from squall.profiles.model import Chance, Distribution, GilbertElliott, Jitter, Loss
from squall.shaping.base import Endpoint, LinkCount, LinkCounters, LinkState
from squall.worker import jsonline

MAX_LINE = 16 << 20  # a 256-worker LinkState is about 65 000 links: a few MB of JSON


class WireError(RuntimeError):
    """A malformed, oversized or unauthenticated message, or a peer that did not answer."""


def token_ok(given: object, expected: str) -> bool:
    """Whether ``given`` is the run's token (constant-time comparison)."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


class NodeCommand(StrEnum):
    """What the harness asks a node agent; each comment is the agent's answer in its own words."""

    HELLO = "hello"  # "This is my node's name, my clock's time and the run I serve."
    WORKERS = "workers"  # "These are the run's worker containers on my node, each checked against /proc."
    RELAY = "relay"  # "I passed your request to that slot's job agent, and here is what it answered."
    FETCH = "fetch"  # "Here are that job's files (result, metrics, log, a program's output), as they are on my node."
    PUT_FILES = "put_files"  # "I wrote these pieces of a copied folder into its copy on my node."
    IMAGE = "image"  # "My node's engine has that image, or has not."
    BUILD = "build"  # "I built that program image on my node's engine, from the context you copied here."
    CONTAINER = "container"  # "I killed, paused, unpaused, restarted or started that worker of mine."
    LINK = "link"  # "I took that worker's data-plane interface down, or brought it back up."
    SHAPE_OPEN = "shape_open"  # "I opened a shaper on my workers' namespaces: here is its backend."
    SHAPE_APPLY = "shape_apply"  # "I applied the part of this link state that lands on my node."
    SHAPE_CLEAR = "shape_clear"  # "I removed everything my shaper added."
    SHAPE_CHECK = "shape_check"  # "My shaping still runs (else an error says what stopped)."
    SHAPE_REPLACE = "shape_replace"  # "I re-planned around the worker that restarted, wherever it runs now."
    SHAPE_COUNTERS = "shape_counters"  # "These are the bytes, packets and drops my node counted per link."
    SHAPE_CLOSE = "shape_close"  # "I cleared and stopped my shaper."


def read_line(sock: socket.socket, limit: int = MAX_LINE) -> dict[str, Any]:
    """One JSON object from one line on ``sock`` (:func:`squall.worker.jsonline.read_line`);
    :class:`WireError` if it is not one."""
    try:
        return jsonline.read_line(sock, limit=limit)
    except jsonline.LineError as exc:
        raise WireError(str(exc)) from exc


def write_line(sock: socket.socket, obj: dict[str, Any]) -> None:
    """Send ``obj`` as one JSON line."""
    jsonline.write_line(sock, obj)


def call(address: tuple[str, int], token: str, request: dict[str, Any], *, timeout: float = 30.0) -> dict[str, Any]:
    """Send ``request`` (with the token) to the agent at ``address`` and return its answer.

    :raises WireError: when the agent cannot be reached, does not answer or answers garbage.
    """
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.settimeout(timeout)
            write_line(sock, {**request, "token": token})
            return read_line(sock)
    except OSError as exc:
        raise WireError(f"node agent at {address[0]}:{address[1]} did not answer {request.get('cmd')!r}: {exc}") \
            from exc


# ----------------------------------------------------------------------------- codecs


def _strict(cls: Any, value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WireError(f"{where}: expected an object, got {type(value).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(value) - known
    if unknown:
        raise WireError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    return value


def link_to_json(spec: LinkSpec) -> dict[str, Any]:
    """A LinkSpec as plain JSON values."""
    return spec.to_dict()


def link_from_json(value: Any, where: str = "link") -> LinkSpec:
    """The LinkSpec :func:`link_to_json` wrote; :class:`WireError` on anything else."""
    d = dict(_strict(LinkSpec, value, where))
    try:
        if "jitter" in d:
            j = dict(_strict(Jitter, d["jitter"], f"{where}.jitter"))
            if "distribution" in j:
                j["distribution"] = Distribution(j["distribution"])
            d["jitter"] = Jitter(**j)
        if "loss" in d:
            loss = dict(_strict(Loss, d["loss"], f"{where}.loss"))
            if loss.get("gemodel") is not None:
                loss["gemodel"] = GilbertElliott(**_strict(GilbertElliott, loss["gemodel"], f"{where}.loss.gemodel"))
            d["loss"] = Loss(**loss)
        for key in ("duplicate", "reorder"):
            if key in d:
                d[key] = Chance(**_strict(Chance, d[key], f"{where}.{key}"))
        return LinkSpec(**d)
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from exc


def state_to_json(state: LinkState) -> dict[str, Any]:
    """A LinkState as plain JSON values: each distinct link setting once, pairs as [src, dst, setting].

    Profiles have few distinct settings and many links (256 workers: 65 280 directed links, about
    0.8 MB this way instead of about 18 MB with the setting written out per link).
    """
    specs: dict[LinkSpec, int] = {}
    for spec in state.links.values():
        specs.setdefault(spec, len(specs))
    return {
        "specs": [link_to_json(spec) for spec in specs],
        "links": [[src, dst, specs[spec]] for (src, dst), spec in sorted(state.links.items())],
        "node_links": [[node, caps.uplink_bps, caps.downlink_bps] for node, caps in sorted(state.node_links.items())],
        "blocked": sorted([src, dst] for src, dst in state.blocked),
    }


def encode_state(state: LinkState) -> str:
    """:func:`state_to_json` as one JSON text: encoded once, sent to every node as a string."""
    return json.dumps(state_to_json(state), separators=(",", ":"))


def decode_state(text: Any) -> LinkState:
    """The LinkState :func:`encode_state` wrote; :class:`WireError` on anything else."""
    if not isinstance(text, str):
        raise WireError(f"a link state is sent as a JSON string, got {type(text).__name__}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise WireError(f"link state: not JSON: {exc}") from exc
    return state_from_json(value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: expected an integer, got {value!r}")
    return value


def _rate(value: Any, where: str) -> int | None:
    return None if value is None else _int(value, where)


def state_from_json(value: Any) -> LinkState:
    """The LinkState :func:`state_to_json` wrote; :class:`WireError` on anything else."""
    if not isinstance(value, dict) or set(value) != {"specs", "links", "node_links", "blocked"}:
        raise WireError("a link state is an object with exactly specs, links, node_links and blocked")
    try:
        specs = [link_from_json(spec, f"specs[{k}]") for k, spec in enumerate(value["specs"])]
        links = {(_int(s, "links.src"), _int(d, "links.dst")): specs[_int(k, "links.setting")]
                 for s, d, k in value["links"]}
        node_links = {_int(n, "node_links.node"): NodeLinkSpec(_rate(up, "uplink_bps"), _rate(down, "downlink_bps"))
                      for n, up, down in value["node_links"]}
        blocked = frozenset((_int(s, "blocked.src"), _int(d, "blocked.dst")) for s, d in value["blocked"])
    except (TypeError, ValueError, IndexError) as exc:
        raise WireError(f"link state: {exc}") from exc
    return LinkState(links, node_links, blocked)


def endpoint_to_json(ep: Endpoint) -> dict[str, Any]:
    """An endpoint as plain JSON values."""
    return {"index": ep.index, "address": ep.address, "netns": ep.netns, "device": ep.device}


def endpoint_from_json(value: Any) -> Endpoint:
    """The endpoint :func:`endpoint_to_json` wrote."""
    d = _strict(Endpoint, value, "endpoint")
    if not all(isinstance(d.get(k), str) for k in ("address", "netns", "device")):
        raise WireError(f"endpoint: address, netns and device must be strings, got {d!r}")
    return Endpoint(_int(d.get("index"), "endpoint.index"), d["address"], d["netns"], d["device"])


def encode_counters(counters: LinkCounters) -> list[list[int]]:
    """A node's link counters as rows ``[src, dst, bytes, packets, dropped]``."""
    return [[s, d, c.bytes, c.packets, c.dropped] for (s, d), c in sorted(counters.links.items())]


def decode_counters(value: Any) -> LinkCounters:
    """The counters :func:`encode_counters` wrote; :class:`WireError` on anything else."""
    if not isinstance(value, list):
        raise WireError(f"link counters are a list of rows, got {type(value).__name__}")
    links: dict[tuple[int, int], LinkCount] = {}
    for row in value:
        if not isinstance(row, list) or len(row) != 5:
            raise WireError(f"a link counter row is [src, dst, bytes, packets, dropped], got {row!r:.80}")
        src, dst, size, packets, dropped = (_int(v, "counters") for v in row)
        if min(size, packets, dropped) < 0:
            raise WireError(f"link counters cannot be negative: {row!r}")
        links[(src, dst)] = links.get((src, dst), LinkCount()) + LinkCount(size, packets, dropped)
    return LinkCounters(links)
