"""Squall's pytest plugin: protocol x profile matrices as tests, with verdicts and a report.

Registered through the ``pytest11`` entry point, so any project with Squall installed can write::

    import pytest

    @pytest.mark.squall(protocols=["ring", "mypkg.proto:main"], profiles=["lan", "wan-5ms"], workers=4)
    def test_converges(squall_trace, squall_check):
        squall_check(converged(squall_trace, Target("accuracy", 0.9)))

Options (``pytest --help``, group "squall"): ``--squall-profiles``, ``--squall-protocols``,
``--squall-workers``, ``--squall-seeds``, ``--squall-backend``, ``--squall-seconds``,
``--squall-matrix FILE_OR_NAME``, ``--squall-report DIR``, ``--squall-calibrate on|off``. A marker's
arguments override the options, which override the matrix file. Test ids read ``ring-wan_5ms-w8``.

Before a profile's first cell the session calibrates it quickly on that cell's cluster (once per
profile, :mod:`squall.experiment.fidelity`; ``--squall-calibrate off`` or the matrix file's ``calibrate: false``
turn it off): the report flags cells run on links that failed it, and the terminal summary lists
each profile's verdict. Cells show their stage and training live on the terminal pytest started on
(plain lines when that is not a terminal).

A user's own program instead of a protocol (one rank per container, torchrun's environment)::

    @pytest.mark.squall(command=["python", "train.py"], metrics={"loss": r"loss (\\S+)"}, target="loss<=1.0",
                        profiles=["thin-20mbit"], workers=4, seconds=60)
    def test_ddp(squall_program):
        assert squall_program.verdict.passed
        assert max(squall_program.bytes_sent) < 50e6

Its keys: ``command`` (a list of words), ``metrics``, ``target`` (a string such as ``'loss<=1.0'``),
``name``, ``workdir`` (default: the test file's folder), ``requirements``, ``pip``, ``env``, ``agree``
(figures every finished rank must end with), and ``hang_after`` (also a protocol's; ``--squall-hang-after``);
``squall_program`` runs the cell and returns a :class:`~squall.programs.result.ProgramResult`
(figures, bytes per rank and per link, each rank's stdout and stderr, the verdict, ``hung``, each rank's
``stacks``, the ``agreement`` and the ``faults`` with their recovery; docs/faults.md).

Fixtures: ``squall_cell`` (the :class:`~squall.experiment.matrix.Cell` of this test), ``squall_lab`` (a
started :class:`~squall.experiment.lab.Lab` for the cell's size, shared by the whole session),
``squall_trace`` (the cell run to a :class:`~squall.run_trace.RunTrace`), ``squall_run`` (run any
:class:`~squall.experiment.lab.RunSpec` on the session's labs) and ``squall_check`` (assert a verdict:
failed and unknown both fail the test; figures go to the JUnit XML and the report).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

logger = logging.getLogger(__name__)

MARKER = "squall"
MARKER_KEYS = {"protocols", "profiles", "workers", "seeds", "seconds", "steps", "task", "target", "lr", "config",
               "compare", "hang_after", "agree"}
#: Marker keys of a program (``command=[...]``) rather than a protocol.
PROGRAM_KEYS = {"command", "metrics", "name", "workdir", "requirements", "pip", "env", "exclude", "agree",
                "nproc_per_node"}
#: Keys a protocol's marker and a program's both take (they do not make a marker a program's).
SHARED_KEYS = {"agree"}
#: Marker keys that make no sense with a command.
PROTOCOL_ONLY = {"protocols", "steps", "task", "lr", "config"}
DEFAULTS: dict[str, Any] = {"protocols": ["ring"], "profiles": ["lan"], "workers": [4], "seeds": [0]}
SESSION_KEY = pytest.StashKey["SquallSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("squall", "Squall: protocols on emulated networks")
    group.addoption("--squall-protocols", help="comma-separated protocols (catalog names or module:function)")
    group.addoption("--squall-profiles", help="comma-separated network profiles (names or YAML paths)")
    group.addoption("--squall-workers", help="comma-separated cluster sizes")
    group.addoption("--squall-seeds", help="comma-separated seeds")
    group.addoption("--squall-seconds", type=float, help="training time budget per cell (default 20)")
    group.addoption("--squall-backend", choices=["netem", "nfqueue"],
                    help="force a shaping backend (default: netem where the kernel has it, else nfqueue)")
    group.addoption("--squall-engine", help="where the cells' workers run: local (this machine's Docker, the default) "
                                            "or swarm (a Docker Swarm with a node agent per node; docs/swarm.md)")
    group.addoption("--squall-matrix", help="matrix YAML with protocols/profiles/workers/seeds: a path, or a shipped "
                                            "matrix by name (ci, demo, ...)")
    group.addoption("--squall-report", type=Path, help="write results.json, report.md and report.html here")
    group.addoption("--squall-replay", type=Path, metavar="RESULTS_DIR",
                    help="run each cell that RESULTS_DIR recorded (same protocol, profile, workers and seed) on "
                         "its recorded timeline: link changes and churn at their recorded times")
    group.addoption("--squall-hang-after", type=float, metavar="S",
                    help="stop a cell as hung when no rank printed a line and the links carried under 1 KB/s for S "
                         "seconds, every rank's stack taken first (default: 120, or the budget when shorter)")
    group.addoption("--squall-calibrate", choices=["on", "off"], default=None,
                    help="calibrate each profile quickly before its first cell (default on; the matrix file's "
                         "calibrate: false turns it off too)")


#: Signals that stop a test session the way Ctrl-C does (a CI runner's cancel sends SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_PREVIOUS_HANDLERS = pytest.StashKey[dict[int, Any]]()


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _stop_like_ctrl_c(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP end the session as Ctrl-C does: pytest stops at once and every fixture tears down.

    Without this, the cluster layer's handler turns them into ``SystemExit``, which pytest counts as one
    failed test and then carries on with the next (a cancelled CI job kept running, containers and all).
    Only signals still at their default handler are taken over, and only in the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            previous[sig] = signal.signal(sig, _interrupt)
    config.stash[_PREVIOUS_HANDLERS] = previous


def pytest_unconfigure(config: pytest.Config) -> None:
    for sig, handler in config.stash.get(_PREVIOUS_HANDLERS, {}).items():
        if signal.getsignal(sig) is _interrupt:
            signal.signal(sig, handler)


def pytest_configure(config: pytest.Config) -> None:
    _stop_like_ctrl_c(config)
    config.addinivalue_line(
        "markers",
        f"{MARKER}(protocols=[...], profiles=[...], workers=N, seeds=[...], seconds=S, steps=K, task=..., "
        "target={...}, lr=..., config={...}): run this test once per protocol x profile x workers x seed cell; "
        "or command=[...], metrics={...}, target='loss<=1.0': a user's own program instead of a protocol",
    )
    config.stash[SESSION_KEY] = SquallSession(config)
    if config.getoption("--squall-engine", None):
        from squall.cluster.spec import select_engine

        select_engine(config.getoption("--squall-engine"))  # the cells' clusters (ClusterSpec's default)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "squall_cell" not in metafunc.fixturenames:
        return
    session: SquallSession = metafunc.config.stash[SESSION_KEY]
    marker = metafunc.definition.get_closest_marker(MARKER)
    kwargs = dict(marker.kwargs) if marker else {}
    if marker and marker.args:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.squall takes keyword arguments only")
    unknown = sorted(set(kwargs) - MARKER_KEYS - PROGRAM_KEYS)
    if unknown:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.squall got unknown argument(s) "
                                f"{unknown}; allowed: {sorted(MARKER_KEYS | PROGRAM_KEYS)}")
    if "command" in kwargs or set(kwargs) & (PROGRAM_KEYS - SHARED_KEYS):
        cells, ids = _program_cells(session, metafunc, kwargs)
        metafunc.parametrize("squall_cell", cells, ids=ids)
        return
    for key, value in kwargs.items():
        problem = _marker_value_problem(key, value)
        if problem:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.squall({key}={value!r:.80}): "
                                    f"{problem}")
    matrix = session.matrix(kwargs, where=metafunc.definition.nodeid, test_dir=Path(metafunc.definition.path).parent)
    for protocol in matrix.protocols:
        session.check_entry_point(protocol, where=metafunc.definition.nodeid)
    metafunc.parametrize("squall_cell", matrix.cells(), ids=matrix.ids())


def _program_cells(session: SquallSession, metafunc: pytest.Metafunc, kwargs: dict[str, Any]) -> tuple[list[Any],
                                                                                                   list[str]]:
    """The cells of a ``command=[...]`` marker: the program on every profile x workers x seed."""
    import dataclasses

    from squall.programs.spec import ProgramError, program_from_mapping

    where = metafunc.definition.nodeid
    if "command" not in kwargs:
        raise pytest.UsageError(f"{where}: @pytest.mark.squall({', '.join(sorted(set(kwargs) & PROGRAM_KEYS))}=...) "
                                "needs command=[...] (the program to run)")
    clash = sorted(set(kwargs) & PROTOCOL_ONLY)
    if clash:
        raise pytest.UsageError(f"{where}: @pytest.mark.squall(command=...) cannot take {clash} (they are a "
                                "protocol's); the program reads its own settings")
    for key in ("seconds", "hang_after"):
        if key in kwargs and _marker_value_problem(key, kwargs[key]):
            raise pytest.UsageError(f"{where}: @pytest.mark.squall({key}={kwargs[key]!r}): allowed: a number > 0")
    test_dir = Path(metafunc.definition.path).parent
    raw = {k: kwargs[k] for k in (*PROGRAM_KEYS, "target") if k in kwargs}
    try:
        program = program_from_mapping(raw, source=f"{where}: @pytest.mark.squall", base=test_dir)
    except ProgramError as exc:
        raise pytest.UsageError(str(exc)) from exc
    axes: dict[str, Any] = {k: kwargs[k] for k in ("profiles", "workers", "seeds") if k in kwargs}
    matrix = session.matrix({**axes, "protocols": ["ring"]}, where=where, test_dir=test_dir)
    matrix = dataclasses.replace(matrix, protocols=(), programs=(program,))
    return matrix.cells(), matrix.ids()


def _looks_like_path(profile: str) -> bool:
    """The profile loader's rule: a separator or a YAML suffix makes a path, anything else a name."""
    return "/" in profile or os.sep in profile or profile.endswith((".yaml", ".yml"))


def resolve_profile_path(profile: str, bases: Sequence[Path], *, where: str) -> str:
    """A relative profile path, resolved against ``bases`` in order (the test file's folder, then the rootdir).

    Names and absolute paths come back unchanged. :raises pytest.UsageError: no base has the file;
    the message lists every place looked in.
    """
    if not _looks_like_path(profile) or Path(profile).is_absolute():
        return profile
    candidates = list(dict.fromkeys(base / profile for base in bases))
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    looked = ", ".join(str(c) for c in candidates)
    raise pytest.UsageError(f"{where}: profile file {profile!r} not found; looked in {looked} (a relative path "
                            "is resolved against the test file's folder, then the rootdir)")


def entry_point_problem(protocol: str) -> str:
    """Why a ``package.module:function`` protocol cannot run, checked on the host; '' if it can.

    Squall imports the module here at collection (and mounts the folder of its top-level package into
    the containers), so a typo or a package that is not importable is found before a cluster starts.
    """
    module_name, _, function = protocol.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        top = module_name.split(".", 1)[0]
        if missing != module_name and not module_name.startswith(f"{missing}."):
            return (f"importing {module_name!r} failed: it imports {missing!r}, which is not installed "
                    f"on this host ({exc})")
        if missing != top:  # the package imports, the module path has a typo
            parent, _, last = missing.rpartition(".")
            where = getattr(sys.modules.get(parent), "__path__", None)
            return f"package {parent!r} ({', '.join(where or []) or '?'}) has no module {last!r} ({exc})"
        return (f"cannot import {module_name!r}: {exc}. Make the folder that holds {top}/ importable on this host: "
                f"pythonpath = [\"<that folder, relative to the rootdir>\"] under [tool.pytest.ini_options] "
                f"in pyproject.toml (or pytest.ini), 'pip install -e .' of your package, or PYTHONPATH; "
                f"sys.path now starts with {sys.path[:3]}")
    except Exception as exc:  # the user's module raised while importing: say where, briefly
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
            tb = tb.tb_next
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f" at {exc.filename}:{exc.lineno}"
        return f"importing {module_name!r} failed{where}: {type(exc).__name__}: {exc}"
    target = getattr(module, function, None)
    if target is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        return (f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no {function!r}; "
                f"its functions: {', '.join(public) or 'none'}")
    if not callable(target):
        return f"{protocol!r} is a {type(target).__name__}, not a function taking the job context"
    return ""


def _number(value: object, *, integer: bool = False) -> bool:
    kinds = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and value > 0


def _marker_value_problem(key: str, value: Any) -> str:
    """Why a marker argument (other than the matrix axes, checked by build_matrix) is unusable; '' if it is fine."""
    if key in ("seconds", "lr", "hang_after") and not _number(value):
        return "allowed: a number > 0"
    if key == "agree":
        from squall.checks.agreement import PROTOCOL_FIGURES, Agree, AgreeError, check_names

        try:
            check_names([Agree.parse(v) for v in ([value] if isinstance(value, str) else value)], PROTOCOL_FIGURES,
                        flag="agree", what="a protocol's records")
        except (AgreeError, TypeError) as exc:
            return str(exc)
    if key == "steps" and not _number(value, integer=True):
        return "allowed: an integer > 0"
    if key == "task" and not (isinstance(value, str) and value):
        return "allowed: a task name such as 'logreg_digits'"
    if key == "target":
        from squall.target import Target, TargetError

        try:
            Target.of(value)
        except TargetError as exc:
            return str(exc)
    if key == "config" and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
        return "allowed: a dict of the protocol's settings keyed by name"
    return ""


class SquallSession:
    """Options, labs shared across cells, and the results for the report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._session: Any = None  # squall.experiment.session.Session, made on first use
        self.cells: list[Any] = []  # squall.report.page.CellResult
        self.matrix_run: dict[str, Any] = {}  # RunSpec fields of --squall-matrix's run: section
        self.checked: dict[str, str] = {}  # third-party entry point -> why it cannot run ('' when it can)
        self.profiles: list[tuple[str, int]] = []  # (profile name or path, cluster size) of every cell run
        self.matrix_calibrate = True  # the matrix file's calibrate: key
        from squall.report import provenance

        self.provenance = provenance.collect()  # for the report's reproduce block

    def option(self, name: str) -> Any:
        return self.config.getoption(f"--squall-{name}")

    def recorded(self, spec: Any, workers: int) -> Any:
        """``spec`` on the timeline ``--squall-replay`` recorded for the same cell (``spec`` without one)."""
        directory = self.option("replay")
        if directory is None:
            return spec
        if not hasattr(self, "_recorded"):
            from squall.experiment.replay import recorded_cells

            self._recorded = {(c.spec.protocol, Path(c.spec.profile).stem, c.workers, c.spec.seed): c
                              for c in recorded_cells(Path(directory))}
        found = self._recorded.get((spec.protocol, Path(spec.profile).stem, workers, spec.seed))
        if found is None:
            raise pytest.UsageError(f"--squall-replay {directory}: no recorded run of {spec.protocol} on "
                                    f"{spec.profile}, {workers} workers, seed {spec.seed}")
        return dataclasses.replace(spec, replay=found.spec.replay)

    def matrix(self, marker: dict[str, Any], *, where: str, test_dir: Path | None = None) -> Any:
        """The test's cells: the matrix file, then the options, then the marker (the last one wins).

        Relative profile paths are resolved against the test file's folder, then the rootdir.
        """
        from squall.experiment.matrix import MatrixError, build_matrix, load_matrix_file
        from squall.protocols.catalog import PROTOCOLS

        raw: dict[str, Any] = dict(DEFAULTS)
        bases = [*([test_dir] if test_dir else []), Path(self.config.rootpath)]
        wanted = self.option("matrix")
        try:
            if wanted is not None:
                path = self.matrix_file(str(wanted))
                shipped = load_matrix_file(path, known_protocols=PROTOCOLS)
                self.matrix_run = dict(shipped.run)  # the file's run: section, under the options and markers
                self.matrix_calibrate = shipped.calibrate
                m = shipped.matrix
                raw.update(protocols=list(m.protocols), profiles=list(m.profiles), workers=list(m.workers),
                           seeds=list(m.seeds))
            for key in ("protocols", "profiles", "workers", "seeds"):
                if self.option(key):
                    raw[key] = self.option(key)
                if key in marker:
                    raw[key] = marker[key]
            if isinstance(raw["profiles"], str):
                raw["profiles"] = [p.strip() for p in raw["profiles"].split(",") if p.strip()]
            if isinstance(raw["profiles"], list | tuple):
                raw["profiles"] = [resolve_profile_path(p, bases, where=where) if isinstance(p, str) else p
                                   for p in raw["profiles"]]
            return build_matrix(raw, source=where, known_protocols=PROTOCOLS)
        except MatrixError as exc:
            raise pytest.UsageError(str(exc)) from exc

    def matrix_file(self, wanted: str) -> Path:
        """``--squall-matrix``: a path (relative to where pytest was started) or a shipped matrix's name."""
        from squall.assets import find_matrix

        is_path = "/" in wanted or os.sep in wanted or wanted.endswith((".yaml", ".yml"))
        if is_path and not Path(wanted).is_absolute():
            wanted = str(Path(self.config.invocation_params.dir) / wanted)
        try:
            return find_matrix(wanted)
        except FileNotFoundError as exc:
            raise pytest.UsageError(f"--squall-matrix: {exc}") from exc

    def check_entry_point(self, protocol: str, *, where: str) -> None:
        """Import a ``package.module:function`` protocol on the host once per session; a usage error if it fails."""
        if ":" not in protocol:
            return
        if protocol not in self.checked:
            self.checked[protocol] = entry_point_problem(protocol)
        if self.checked[protocol]:
            raise pytest.UsageError(f"{where}: protocol {protocol!r}: {self.checked[protocol]}")

    @property
    def session(self) -> Any:
        """The cells' :class:`squall.experiment.session.Session` (the one the CLI holds too), made on first use."""
        if self._session is None:
            from squall.experiment.fidelity import SessionCalibration
            from squall.experiment.session import Session

            wanted = self.option("calibrate")
            enabled = wanted == "on" if wanted is not None else self.matrix_calibrate
            self._session = Session(backend=self.option("backend"), observers=self._display,
                                    fidelity=SessionCalibration(enabled=enabled, progress=logger.info))
        return self._session

    def _display(self, label: str) -> Any:
        """A lab's live display, written to the terminal pytest started on (the capture lifted around each write)."""
        from squall.progress import cell_progress

        capture = self.config.pluginmanager.getplugin("capturemanager")
        guard = capture.global_and_fixture_disabled if capture is not None else None
        return cell_progress(label, guard=guard)

    @property
    def fidelity(self) -> Any:
        """The session's calibrations (:class:`squall.experiment.fidelity.SessionCalibration`)."""
        return self.session.fidelity

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def _require_docker(session: SquallSession) -> None:
    """Before a cell's first container: the engine answers and this process can shape the links
    (:func:`squall.cluster.preflight.preflight`); else fail the cell under ``CI=true``, skip it otherwise."""
    from squall.cluster.engine import docker_client, in_ci
    from squall.cluster.errors import EngineUnavailable
    from squall.cluster.preflight import NotReady, preflight

    try:
        preflight(session.option("backend"), engine=None)
        docker_client()
    except (EngineUnavailable, NotReady) as exc:
        if in_ci():
            pytest.fail(f"{exc} (CI=true: an environment not ready is a failure)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def squall_session(request: pytest.FixtureRequest) -> Iterator[SquallSession]:
    """Name: squall_session. Scope: session. The plugin's state; closes every lab at the end."""
    session: SquallSession = request.config.stash[SESSION_KEY]
    yield session
    session.close()


@pytest.fixture
def squall_lab(request: pytest.FixtureRequest, squall_cell: Any, squall_session: SquallSession) -> Any:
    """Name: squall_lab. Scope: function (the lab itself lives for the session). Depends: Docker."""
    _require_docker(squall_session)
    return squall_session.session.lab(squall_cell.workers, squall_cell.protocol, label=request.node.nodeid)


def _spec_from(cell: Any, marker: pytest.Mark | None, session: SquallSession, **over: Any) -> Any:
    from squall.experiment.lab import RunSpec

    kwargs = dict(marker.kwargs) if marker else {}
    keys = ("steps", "task", "target", "lr", "config", "batch_size", "hang_after", "agree")
    extra: dict[str, Any] = {k: session.matrix_run[k] for k in keys if k in session.matrix_run}
    if session.option("hang-after") is not None:
        extra["hang_after"] = session.option("hang-after")
    extra.update({k: kwargs[k] for k in keys if k in kwargs})
    if isinstance(extra.get("agree"), str):
        extra["agree"] = (extra["agree"],)
    seconds = kwargs.get("seconds", session.option("seconds") or session.matrix_run.get("seconds") or 20.0)
    fields: dict[str, Any] = {**extra, **over}
    return RunSpec(protocol=cell.protocol, profile=cell.profile, seed=cell.seed, seconds=seconds, **fields)


@pytest.fixture
def squall_trace(request: pytest.FixtureRequest, squall_cell: Any, squall_lab: Any,
                 squall_session: SquallSession) -> Any:
    """Name: squall_trace. Scope: function. Depends: squall_cell, squall_lab. The cell's RunTrace."""
    spec = squall_session.recorded(_spec_from(squall_cell, request.node.get_closest_marker(MARKER), squall_session),
                                   squall_cell.workers)
    trace = squall_session.session.run(spec, squall_cell.workers, label=request.node.nodeid)
    request.node.stash[_TRACE] = trace
    from squall.checks.liveness import run_verdicts

    request.node.stash.setdefault(_VERDICTS, []).extend(run_verdicts(trace.meta))  # hung, --agree: in the report
    request.node.user_properties.append(("squall_hung", trace.meta.hang is not None))
    request.node.user_properties.append(("squall_backend", trace.backend))
    calibrated = squall_session.fidelity.verdicts.get(spec.profile)
    request.node.user_properties.append(("squall_calibration", calibrated or "not calibrated"))
    return trace


_TRACE = pytest.StashKey[Any]()
_VERDICTS = pytest.StashKey[list[Any]]()


@pytest.fixture
def squall_comparison(request: pytest.FixtureRequest, squall_session: SquallSession, tmp_path: Path) -> Any:
    """Name: squall_comparison. Scope: function. Depends: a ``compare={...}`` marker, Docker.

    Runs the marker's comparison (``squall compare``'s experiment: pairs of runs on the session's cluster)
    and fails the test only on a detected regression (a gating measure ``worse``); otherwise returns the
    :class:`squall.experiment.comparison.CompareResult` for the test's own asserts. ``compare`` takes
    ``baseline`` and ``candidate`` (a command as a list of words, or a protocol ``'NAME [KEY=VALUE ...]'``),
    or ``ref`` and ``command``; and ``runs``, ``max_runs``, ``tolerance``, ``gate``, ``seconds``, ``seed``;
    the marker's ``profiles``, ``workers``, ``metrics``, ``target``, ``workdir``... apply to both sides.
    """
    from squall.cli.compare import format_result
    from squall.experiment.comparison import CompareResult, plan_from, run_comparison
    from squall.programs.snapshot import resolve_ref, snapshot_ref
    from squall.programs.spec import ProgramError, program_from_mapping
    from squall.target import Target, TargetError

    marker = request.node.get_closest_marker(MARKER)
    kwargs = dict(marker.kwargs) if marker else {}
    where = f"{request.node.nodeid}: @pytest.mark.squall"
    if "compare" not in kwargs:
        raise pytest.UsageError(f"{where}: squall_comparison needs compare={{'baseline': ..., 'candidate': ...}}")
    test_dir = Path(request.node.path).parent
    shared = {k: kwargs[k] for k in PROGRAM_KEYS - {"command", "name"} if k in kwargs}
    if "target" in kwargs:
        shared["target"] = kwargs["target"]

    def program(command: list[str], name: str, workdir: str | None = None) -> Any:
        raw = {**shared, "command": command, "name": name, **({"workdir": workdir} if workdir else {})}
        return program_from_mapping(raw, source=where, base=test_dir)

    def ref_program(ref: str, command: list[str]) -> Any:
        folder = program(command, "candidate").workdir
        snap = snapshot_ref(resolve_ref(ref, folder, flag=f"{where}: compare ref"), tmp_path / "ref")
        return program(command, "baseline", workdir=snap.path)

    profiles = kwargs.get("profiles") or _split(squall_session.option("profiles")) or DEFAULTS["profiles"]
    workers = kwargs.get("workers") or (_split(squall_session.option("workers")) or DEFAULTS["workers"])[0]
    try:
        target = Target.of(kwargs.get("target"))
        plan = plan_from(kwargs["compare"], where=where, profiles=[str(p) for p in profiles], workers=int(workers),
                         program=program, ref_snapshot=ref_program, target=target,
                         seconds=float(kwargs.get("seconds", 60.0)))
    except (ProgramError, TargetError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    _require_docker(squall_session)
    result = CompareResult(plan, run_comparison(plan, squall_session.session, logs=tmp_path / "ranks"))
    request.node.user_properties.append(("squall_compare_verdict", result.verdict))
    if result.regression:
        pytest.fail(format_result(result), pytrace=False)
    return result


def _split(value: Any) -> list[str]:
    if not value:
        return []
    return [v.strip() for v in str(value).split(",") if v.strip()]


@pytest.fixture
def squall_program(request: pytest.FixtureRequest, squall_cell: Any, squall_session: SquallSession,
                   tmp_path: Path) -> Any:
    """Name: squall_program. Scope: function. Depends: squall_cell (a ``command=[...]`` marker), Docker.

    Runs the cell's program and returns a :class:`squall.programs.result.ProgramResult`: its figures,
    bytes per rank and per link, each rank's stdout and stderr (``tmp_path/ranks``), and its verdict.
    """
    from squall.programs.result import ProgramResult
    from squall.programs.verdict import judge

    program = squall_cell.program
    if program is None:
        raise pytest.UsageError(f"{request.node.nodeid}: squall_program needs @pytest.mark.squall(command=[...])")
    _require_docker(squall_session)
    marker = request.node.get_closest_marker(MARKER)
    kwargs = dict(marker.kwargs) if marker else {}
    seconds = float(kwargs.get("seconds", squall_session.option("seconds") or squall_session.matrix_run.get("seconds")
                                or 60.0))
    hang_after = kwargs.get("hang_after", squall_session.option("hang-after")
                            or squall_session.matrix_run.get("hang_after"))
    done = squall_session.session.run_program(program, squall_cell.profile, squall_cell.workers, seconds=seconds,
                                              seed=squall_cell.seed, logs=tmp_path / "ranks",
                                              label=request.node.nodeid,
                                              hang_after=float(hang_after) if hang_after is not None else None)
    verdict = judge(done.trace, done.runs, target=program.target, metric_names=program.metric_names)
    request.node.stash[_TRACE] = done.trace
    request.node.stash.setdefault(_VERDICTS, []).append(verdict)
    request.node.user_properties.append(("squall_backend", done.trace.backend))
    request.node.user_properties.append(("squall_program_verdict", {True: "pass", False: "fail", None: "unknown"}
                                         [verdict.passed]))
    request.node.user_properties.append(("squall_hung", done.trace.meta.hang is not None))
    return ProgramResult(done.trace, verdict, program.target, done.runs)


@pytest.fixture
def squall_run(request: pytest.FixtureRequest, squall_session: SquallSession) -> Callable[..., Any]:
    """Name: squall_run. Scope: function. Depends: Docker. ``squall_run(RunSpec, workers=N)`` -> RunTrace."""

    def run(spec: Any, *, workers: int) -> Any:
        _require_docker(squall_session)
        return squall_session.session.run(spec, workers, label=request.node.nodeid)

    return run


@pytest.fixture
def squall_check(request: pytest.FixtureRequest) -> Callable[[Any], None]:
    """Name: squall_check. Scope: function. ``squall_check(verdict)``: record it, fail unless it passed."""
    from squall.checks import Validity

    verdicts: list[Any] = request.node.stash.setdefault(_VERDICTS, [])

    def check(verdict: Any) -> None:
        verdicts.append(verdict)
        request.node.user_properties.append((f"squall_{verdict.check}_measured", str(verdict.measured)))
        request.node.user_properties.append((f"squall_{verdict.check}_expected", verdict.expected))
        request.node.user_properties.append((f"squall_{verdict.check}_verdict", verdict.validity.value))
        if verdict.validity is not Validity.PASS:  # unknown is not a pass
            pytest.fail(verdict.line(), pytrace=False)

    return check


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    yield
    if call.when != "call" or _TRACE not in item.stash:
        return
    from squall.report.page import CellResult

    session: SquallSession = item.config.stash[SESSION_KEY]
    cell = item.callspec.params.get("squall_cell") if hasattr(item, "callspec") else None
    cell_id = cell.id(with_seed=True) if cell is not None else item.name
    verdicts: list[Any] = item.stash.get(_VERDICTS, [])
    trace = item.stash[_TRACE]
    session.cells.append(CellResult(cell_id, trace, tuple(verdicts)))
    session.profiles.append((cell.profile, cell.workers) if cell is not None else (trace.profile, trace.nodes))


def pytest_sessionfinish(session: pytest.Session) -> None:
    squall: SquallSession | None = session.config.stash.get(SESSION_KEY, None)
    if squall is None:
        return
    squall.close()
    directory = squall.option("report")
    if directory is not None and squall.cells:
        from squall.report import provenance
        from squall.report.network import describe_profiles
        from squall.report.page import Results, write_report

        meta: dict[str, Any] = {"provenance": provenance.finish(squall.provenance),
                                "profiles": describe_profiles(squall.profiles)}
        target = squall.matrix_run.get("target")
        if target:
            meta["target"] = dict(target)
        calibration = tuple(squall.fidelity.rows)
        if not squall.fidelity.enabled:
            meta["calibration"] = "off: the emulation of these profiles was not checked in this run"
        _, page = write_report(Results(title="Squall matrix", cells=tuple(squall.cells), calibration=calibration,
                                       meta=meta), directory)
        logger.info("squall report: %s", page)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line per profile the session calibrated: was its emulation faithful?"""
    squall: SquallSession | None = config.stash.get(SESSION_KEY, None)
    if squall is None or squall._session is None or not squall.fidelity.verdicts:
        return
    terminalreporter.section("squall calibration")
    for profile, verdict in squall.fidelity.verdicts.items():
        why = squall.fidelity.failures.get(profile, [])
        terminalreporter.write_line(f"{profile}: {verdict}" + (f" ({'; '.join(why[:3])})" if why else ""))
