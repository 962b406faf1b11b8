"""Discovery: every shipped protocol is found where it is declared; duplicates, bad declarations and
unknown names are rejected with errors that say what is allowed; ``squall protocols`` lists them."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from squall.cli.protocols import main as protocols_cli
from squall.protocols.catalog import (
    PROTOCOLS,
    algorithms,
    collect,
    declarations_of,
    discover,
    lookup,
    make_algorithm,
    source_of,
)
from squall.training.algorithms import LOCAL
from squall.training.declaration import AlgorithmDeclaration, Declaration, DeclarationError, JobDeclaration
from squall.training.options import option_keys, read_options
from squall.transport import inproc_mesh
from squall.worker.registry import REGISTRY, UnknownEntry, jobs, resolve

#: Every shipped protocol and the folder whose protocol.py declares it.
SHIPPED = {
    "ring": "allreduce", "butterfly": "allreduce", "local_sgd": "allreduce",
    "gloo": "baselines",
    "dpsgd": "dpsgd", "dpsgd_torus": "dpsgd", "dpsgd_exp": "dpsgd", "sgp": "sgp",
    "matcha": "matcha",
    "ps": "ps",
    "swarm": "swarm",
    "moshpit": "moshpit",
    "dropcompute": "dropcompute", "dropcompute_off": "dropcompute",
    "nonblocking_ring": "nonblocking", "nonblocking_dpsgd": "nonblocking", "nonblocking_matcha": "nonblocking",
    "al_dsgd": "al_dsgd",
    "lossy_sgd": "lossy_sgd", "lossy_sgd_noresync": "lossy_sgd",
    "topk": "topk", "randk": "randk", "arc_topk": "arc_topk", "lowbit_allreduce": "lowbit", "lowbit_ring": "lowbit",
    "diloco": "diloco", "diloco_h10": "diloco", "diloco_h50": "diloco", "ddp_adamw": "diloco", "local_adamw": "diloco",
    "streaming_diloco": "streaming_diloco", "streaming_diloco_fp32": "streaming_diloco", "sparta": "sparta",
    "demo": "demo",
}
SHIPPED_JOBS = {"gloo_train", "gloo_allreduce", "swarm", "moshpit", "moshpit_average", "dropcompute", "nonblocking",
                "al_dsgd", "lossy_sgd"}
SHIPPED_ALGORITHMS = {"local", "allreduce", "local_sgd", "dpsgd", "sgp", "matcha", "ps",
                      "topk", "randk", "arc_topk", "lowbit_allreduce", "lowbit_ring",
                      "diloco", "ddp_adamw", "streaming_diloco", "sparta", "demo"}
UTILITY_JOBS = {"noop", "echo_mesh", "sleep", "fail", "sysinfo", "reach", "udp_probe", "tcp_goodput", "tcp_rtt",
                "train", "allreduce_bench", "command"}

THIRD_PARTY = Declaration("elsewhere", "declared by another distribution", "elsewhere_pkg.jobs:main",
                          paper="Someone, Somewhere 2025")


def toy(name: str = "x") -> Declaration:
    return Declaration(name, "toy", "train")


@pytest.fixture
def fresh_catalog() -> Iterator[None]:
    """The catalog is read again by the test, and again after it (its cache holds no test's view)."""
    discover.cache_clear()
    yield
    discover.cache_clear()


def with_entry_points(monkeypatch: pytest.MonkeyPatch, *points: importlib.metadata.EntryPoint) -> None:
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: list(points) if kw == {"group": "squall.protocols"} else real(**kw))


# -- the shipped protocols --------------------------------------------------------------------------

def test_every_shipped_protocol_is_found_in_its_folder() -> None:
    assert set(PROTOCOLS) == set(SHIPPED)
    for name, folder in SHIPPED.items():
        assert source_of(name) == f"squall.protocols.{folder}.protocol"
        assert lookup(name) is PROTOCOLS[name]
        assert lookup(name).description
    assert {n for n, p in PROTOCOLS.items() if not p.paper} == {"ring", "gloo"}  # the baselines
    assert set(discover().jobs) == SHIPPED_JOBS
    assert set(algorithms()) == SHIPPED_ALGORITHMS


def test_shipped_configs_are_unchanged() -> None:
    assert dict(lookup("ring").config) == {"algorithm": "allreduce", "algorithm_args": {"collective": "ring"}}
    assert dict(lookup("gloo").config) == {"algorithm": "allreduce"}
    assert dict(lookup("matcha").config) == {"algorithm": "matcha",
                                             "algorithm_args": {"topology": "ring", "budget": 0.5}}
    assert (lookup("moshpit").entry, lookup("swarm").entry, lookup("gloo").entry) == ("moshpit", "swarm", "gloo_train")
    assert {n for n, p in PROTOCOLS.items() if p.rejoins} == {"moshpit"}
    assert lookup("gloo").needs == frozenset({"tcp", "device_model", "torch_distributed"})


def test_every_entry_resolves_and_every_train_protocol_builds() -> None:
    assert set(REGISTRY) == UTILITY_JOBS  # the registry keeps only jobs of no protocol
    assert set(jobs()) == UTILITY_JOBS | SHIPPED_JOBS
    transport = inproc_mesh(4)[0]
    for name, protocol in PROTOCOLS.items():
        assert callable(resolve(protocol.entry)), name
        if protocol.entry == "train":
            config = protocol.config
            algorithm = make_algorithm(config["algorithm"], transport, options=config.get("algorithm_args"))
            assert algorithm.name == config["algorithm"], name


def test_unknown_names_say_what_is_known() -> None:
    with pytest.raises(KeyError, match=r"unknown protocol 'nosuch'; known: \[.*'moshpit'.*\], "
                                       r"or give 'package.module:function'"):
        lookup("nosuch")
    third = lookup("mypkg.proto:main")
    assert (third.name, third.entry, dict(third.config), third.rejoins) == ("mypkg.proto:main", "mypkg.proto:main",
                                                                            {}, False)
    with pytest.raises(UnknownEntry, match=r"unknown entry point 'nosuch'; registered: \[.*'moshpit_average'.*\]"):
        resolve("nosuch")
    with pytest.raises(ValueError, match=r"unknown algorithm 'nosuch'; known: \[.*'matcha'.*\]"):
        make_algorithm("nosuch", inproc_mesh(2)[0])


# -- duplicates and malformed declarations -----------------------------------------------------------

def test_a_name_declared_twice_names_both_sources() -> None:
    with pytest.raises(DeclarationError, match=r"protocol 'x' is declared twice: by pkg_a\.protocol and by dist_b"):
        collect([("pkg_a.protocol", (toy(),)), ("dist_b", (toy(),))])
    job = JobDeclaration("j", "a.b:c")
    with pytest.raises(DeclarationError, match="job 'j' is declared twice: by a and by b"):
        collect([("a", (job,)), ("b", (job,))])
    algorithm = AlgorithmDeclaration("alg", lambda t, s, o: make_algorithm("local", t))
    with pytest.raises(DeclarationError, match="algorithm 'alg' is declared twice: by a and by a"):
        collect([("a", (algorithm, algorithm))])
    # One name may be a protocol, a job and an algorithm at once (moshpit is all three).
    both = collect([("a", (toy("same"), JobDeclaration("same", "a.b:c")))])
    assert set(both.protocols) == set(both.jobs) == {"same"}


def test_a_shipped_name_declared_again_by_an_entry_point_is_rejected(
    monkeypatch: pytest.MonkeyPatch, fresh_catalog: None
) -> None:
    with_entry_points(monkeypatch, importlib.metadata.EntryPoint("dup", "tests.unit.test_protocols_catalog:DUPLICATE",
                                                                 "squall.protocols"))
    with pytest.raises(DeclarationError, match=r"protocol 'moshpit' is declared twice: by squall.protocols.moshpit."
                       r"protocol and by entry point dup = 'tests.unit.test_protocols_catalog:DUPLICATE'"):
        discover()


DUPLICATE = [Declaration("moshpit", "an impostor", "train")]


def test_a_registry_job_declared_by_a_folder_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    import squall.protocols.catalog

    clash = collect([("protocols.x.protocol", (JobDeclaration("noop", "x.y:z"),))])
    monkeypatch.setattr(squall.protocols.catalog, "discover", lambda: clash)
    with pytest.raises(DeclarationError, match=r"jobs \['noop'\] are declared by a protocol folder and by "
                                               r"squall/worker/registry.py"):
        jobs()
    local = collect([("protocols.x.protocol", (AlgorithmDeclaration("local", LOCAL.build),))])
    monkeypatch.setattr(squall.protocols.catalog, "discover", lambda: local)
    with pytest.raises(DeclarationError, match="algorithm 'local' is built in"):
        algorithms()
    with pytest.raises(UnknownEntry, match=r"entry point 'moshpit': the protocol declarations cannot be read "
                                           r"\(jobs \['noop'\] are declared by a protocol folder"):
        monkeypatch.setattr(squall.protocols.catalog, "discover", lambda: clash)
        resolve("moshpit")
    assert resolve("noop") is not None  # utility jobs never wait on the declarations


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"needs": frozenset({"gpu"})}, r"unknown needs \['gpu'\]; allowed: \['device_model', 'tcp', "
                                    r"'torch_distributed', 'udp'\]"),
    ({"needs": {"udp"}}, "needs must be a frozenset, got set"),
    ({"name": "has space"}, "protocol name 'has space' must be a non-empty identifier"),
    ({"name": ""}, "protocol name '' must be a non-empty identifier"),
    ({"entry": "pkg.mod:"}, r"entry 'pkg.mod:' must be a job name or 'package.module:function'"),
    ({"entry": "no such job"}, "entry job name 'no such job' must be a non-empty identifier"),
])
def test_malformed_declarations_say_what_is_allowed(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "x", "description": "toy", "entry": "train", **kwargs}
    with pytest.raises(DeclarationError, match=message):
        Declaration(**fields)  # type: ignore[arg-type]


def test_declarations_are_frozen_and_their_config_read_only() -> None:
    protocol = lookup("ring")
    with pytest.raises(AttributeError):
        protocol.rejoins = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        protocol.config["algorithm"] = "dpsgd"  # type: ignore[index]
    with pytest.raises(DeclarationError, match=r"target 'nocolon' must be 'package\.module:function'"):
        JobDeclaration("j", "nocolon")
    with pytest.raises(DeclarationError, match="build must be callable"):
        AlgorithmDeclaration("a", "not callable")  # type: ignore[arg-type]


def test_entry_points_may_hold_one_declaration_a_sequence_or_a_module() -> None:
    import squall.protocols.moshpit.protocol as module

    assert declarations_of(THIRD_PARTY, "s") == (THIRD_PARTY,)
    assert declarations_of([THIRD_PARTY], "s") == (THIRD_PARTY,)
    assert declarations_of(module, "s") == module.DECLARATIONS
    with pytest.raises(DeclarationError, match=r"ep: expected a Declaration, .* got a sequence holding \['str'\]"):
        declarations_of(["moshpit"], "ep")
    with pytest.raises(DeclarationError, match=r"ep: expected a Declaration, .* got dict"):
        declarations_of({"name": "x"}, "ep")
    with pytest.raises(DeclarationError, match="module 'json' exports no DECLARATIONS"):
        declarations_of(json, "ep")


# -- third-party declarations through the entry-point group -------------------------------------------

def test_an_entry_point_declaration_is_found(monkeypatch: pytest.MonkeyPatch, fresh_catalog: None) -> None:
    entry = importlib.metadata.EntryPoint("elsewhere", f"{__name__}:THIRD_PARTY", "squall.protocols")
    with_entry_points(monkeypatch, entry)
    assert lookup("elsewhere") is THIRD_PARTY
    assert source_of("elsewhere") == "entry point elsewhere = 'tests.unit.test_protocols_catalog:THIRD_PARTY'"
    assert set(PROTOCOLS) == set(SHIPPED) | {"elsewhere"}


def test_a_broken_entry_point_names_itself(monkeypatch: pytest.MonkeyPatch, fresh_catalog: None) -> None:
    with_entry_points(monkeypatch, importlib.metadata.EntryPoint("broken", "no_such_module_xyz:X", "squall.protocols"))
    with pytest.raises(DeclarationError, match=r"entry point broken = 'no_such_module_xyz:X': cannot load it "
                                               r"\(ModuleNotFoundError"):
        discover()


# -- squall protocols ---------------------------------------------------------------------------------

def test_cli_lists_every_protocol_with_its_paper_and_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert protocols_cli(["protocols"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "DESCRIPTION", "PAPER", "SOURCE"]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(SHIPPED)
    moshpit = next(line for line in lines if line.startswith("moshpit "))
    assert "Ryabinin et al., NeurIPS 2021" in moshpit and moshpit.endswith("squall.protocols.moshpit.protocol")

    assert protocols_cli(["protocols", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == sorted(SHIPPED)
    gloo = next(r for r in rows if r["name"] == "gloo")
    assert gloo == {"name": "gloo", "description": "synchronous SGD over torch.distributed (gloo)", "paper": "",
                    "source": "squall.protocols.baselines.protocol", "entry": "gloo_train", "rejoins": False,
                    "needs": ["device_model", "tcp", "torch_distributed"]}


def test_cli_exit_codes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                        fresh_catalog: None) -> None:
    with pytest.raises(SystemExit) as usage:
        protocols_cli(["protocols", "--bogus"])
    assert usage.value.code == 2
    with_entry_points(monkeypatch, importlib.metadata.EntryPoint("dup", "tests.unit.test_protocols_catalog:DUPLICATE",
                                                                 "squall.protocols"))
    assert protocols_cli(["protocols"]) == 2
    assert "protocol 'moshpit' is declared twice" in capsys.readouterr().err


def test_a_utility_job_starts_without_the_protocol_packages() -> None:
    """Resolving a probe job imports neither torch nor squall.training: the calibration containers
    preload nothing, and a probe whose start waits for those imports misses its common start time."""
    code = ("import sys; from squall.worker.registry import resolve; resolve('udp_probe'); resolve('noop'); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('squall.training', "
            "'squall.protocols.catalog'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_declared_algorithm_reads_its_options_into_a_dataclass() -> None:
    """The keys an algorithm takes are its options class's fields; every class's defaults read."""
    known = algorithms()
    assert sorted(name for name, declared in known.items() if declared.options is None) == []
    for name, declared in known.items():
        assert declared.options is not None
        keys = option_keys(declared.options)
        read_options(declared.options, {}, where=f"algorithm {name!r}")  # the defaults are valid
        assert all(key.isidentifier() for key in keys), name
    with pytest.raises(DeclarationError, match="options must be a dataclass"):
        AlgorithmDeclaration("alg", LOCAL.build, "ratio, timeout")  # type: ignore[arg-type]
