"""The one session of cells: labs shared across cells, each profile calibrated once, every cell run one way.

``squall run``, ``squall matrix``, ``squall compare``, the demo and the pytest plugin all hold a
:class:`Session`. It starts one :class:`~squall.experiment.lab.Lab` per cluster size and code (a
protocol's third-party package, or a program's folder and image) on first use and closes them all
at the end, each even when another one's teardown failed. Before a profile's first cell it
calibrates the profile quickly on that cell's own cluster (:mod:`.fidelity`), and a profile whose
links change during the run gets each segment of its timeline judged too; the report draws them.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from squall.experiment.driver import ExperimentError
from squall.experiment.fidelity import SessionCalibration
from squall.experiment.lab import Lab, RunSpec, code_dir_of
from squall.experiment.program import ProgramRun, program_image, run_program
from squall.programs.snapshot import Snapshot, snapshot_folder
from squall.programs.spec import ProgramSpec
from squall.progress import Observer
from squall.run_trace import RunTrace

logger = logging.getLogger(__name__)

#: Makes the live display of a new lab, given the label of the cell that starts it.
ObserverFactory = Callable[[str], Observer]


class Session:
    """Labs per (size, code), started on first use; calibration once per profile; one way to run a cell."""

    def __init__(self, *, backend: str | None = None, fidelity: SessionCalibration | None = None,
                 observer: Observer | None = None, observers: ObserverFactory | None = None,
                 snapshots: Path | None = None) -> None:
        """:param observer: one display shared by every lab (the CLI's).
        :param observers: or a display made for each lab (the plugin's: one per terminal writer).
        :param fidelity: the session's calibrations (None: none).
        :param snapshots: where programs' folders are copied for the containers (:mod:`squall.programs.snapshot`)
            and kept with the results; None: a temporary folder removed when the session closes."""
        self.backend = backend
        self.fidelity = fidelity if fidelity is not None else SessionCalibration(enabled=False)
        self.observer = observer
        self.observers = observers
        self.labs: dict[tuple[int, tuple[str, ...]], Lab] = {}
        self.images: dict[tuple[str, ...], str | None] = {}  # a program's requirements -> its image
        self.segments: dict[tuple[str, int, float | None], dict[str, Any] | None] = {}  # judged once each
        self._made: list[Observer] = []  # displays made by ``observers``, closed with the session
        self._snapshot_root = snapshots.resolve() if snapshots is not None else None
        self._own_snapshots = snapshots is None
        self.snapshots: dict[tuple[str, tuple[str, ...]], Snapshot] = {}  # (folder, excludes) -> its snapshot

    # -- labs ---------------------------------------------------------------------------------------
    def _display(self, label: str) -> Observer | None:
        if self.observers is not None:
            made = self.observers(label)
            self._made.append(made)
            return made
        return self.observer

    def _labelled(self, key: tuple[int, tuple[str, ...]], label: str, make: Callable[[Observer | None], Lab]) -> Lab:
        if key not in self.labs:
            self.labs[key] = make(self._display(label)).__enter__()
        lab = self.labs[key]
        if label and hasattr(lab.progress, "label"):
            lab.progress.label = label
        return lab

    def lab(self, workers: int, protocol: str, *, label: str = "") -> Lab:
        """The lab of this size that can run ``protocol`` (its third-party package mounted)."""
        code = code_dir_of(protocol)
        codes = (code,) if code else ()
        return self._labelled((workers, codes), label, lambda progress: Lab(
            workers=workers, backend=self.backend, code=codes, progress=progress))

    def snapshot(self, program: ProgramSpec) -> Snapshot:
        """The read-only copy of ``program``'s folder the containers mount (made once per session)."""
        key = (program.workdir, program.excludes)
        if key not in self.snapshots:
            if self._snapshot_root is None:
                self._snapshot_root = Path(tempfile.mkdtemp(prefix="squall-snapshots-"))
            dest = self._snapshot_root / f"{program.name}-{len(self.snapshots)}"
            if dest.exists():  # a results folder used again: this session's copy replaces the last one's
                shutil.rmtree(dest)
            folder = Path(program.workdir)
            ours = _inside(self._snapshot_root, folder)  # the snapshots, and the report that holds them, when
            if not self._own_snapshots:                   # inside the folder: never copied into themselves
                ours += _inside(self._snapshot_root.parent, folder)
            self.snapshots[key] = snapshot_folder(program.workdir, dest, excludes=(*program.excludes, *ours))
            logger.info("%s: %d files (%.1f MB) copied for the containers to %s", program.workdir,
                        self.snapshots[key].files, self.snapshots[key].size / 1e6, dest)
        return self.snapshots[key]

    def program_lab(self, workers: int, programs: Sequence[ProgramSpec], *, label: str = "") -> Lab:
        """The lab of this size that mounts the folders of ``programs`` (snapshots) and runs their image
        (requirements built first; programs that share a lab must share their requirements)."""
        needs = {p.requirements for p in programs}
        if len(needs) != 1:
            raise ExperimentError(f"programs {[p.name for p in programs]} need different requirements "
                                  f"({sorted(needs)}): they cannot share containers")
        first = programs[0]
        if first.requirements not in self.images:
            self.images[first.requirements] = program_image(first)
        image = self.images[first.requirements]
        folders = tuple(dict.fromkeys(self.snapshot(p).path for p in programs))
        key = (workers, ("program", *folders, image or ""))
        return self._labelled(key, label, lambda progress: Lab(
            workers=workers, backend=self.backend, image=image, workdirs=folders, preload=(), progress=progress))

    def backends(self) -> list[str]:
        """Shaping backends of the labs started so far."""
        return sorted({lab.backend for lab in self.labs.values()})

    # -- cells --------------------------------------------------------------------------------------
    def calibrate(self, lab: Lab, profile: str, workers: int) -> None:
        """Calibrate ``profile`` on ``lab`` unless this session has (or calibration is off)."""
        if self.fidelity.enabled and profile not in self.fidelity.verdicts and lab.cluster is not None:
            lab.progress.stage("calibrating", profile)
            self.fidelity.ensure(profile, lab.cluster, workers, shaper=lab.shaper)

    def run(self, spec: RunSpec, workers: int, *, label: str = "") -> RunTrace:
        """One protocol cell: its lab, its profile calibrated, the run (with its segments judged)."""
        lab = self.lab(workers, spec.protocol, label=label)
        self.calibrate(lab, spec.profile, workers)
        segments = self._segments(lab, spec.profile, workers, spec.seconds)
        trace = lab.run(spec)
        return _with_segments(trace, segments)

    def run_program(self, program: ProgramSpec, profile: str, workers: int, *, seconds: float, seed: int = 0,
                    logs: Path, label: str = "", together: Sequence[ProgramSpec] = (),
                    hang_after: float | None = None) -> ProgramRun:
        """One program cell: its lab, its profile calibrated, the run (with its segments judged).

        :param together: programs that share this one's containers (a comparison's other side).
        :param hang_after: stop it as hung after this long without progress (None: the default).
        """
        lab = self.program_lab(workers, [program, *together], label=label)
        self.calibrate(lab, profile, workers)
        segments = self._segments(lab, profile, workers, seconds)
        snap = self.snapshot(program)
        done = run_program(lab, program, profile, seconds=seconds, seed=seed, logs=logs, folder=snap.path,
                           hang_after=hang_after)
        trace = _with_segments(done.trace, segments)
        if trace.meta.program is not None:
            program_meta = dataclasses.replace(trace.meta.program, snapshot=snap.to_json())
            trace = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, program=program_meta))
        return dataclasses.replace(done, trace=trace)

    def _segments(self, lab: Lab, profile: str, workers: int, seconds: float | None) -> dict[str, Any] | None:
        """A profile whose links change during the run: each segment of its timeline judged
        (:mod:`squall.calibration.segments`) over the run's length; None for one that holds still."""
        if not self.fidelity.enabled or lab.cluster is None or lab.shaper is None:
            return None
        key = (profile, workers, seconds)
        if key not in self.segments:
            self.segments[key] = self._judge_segments(lab, profile, workers, seconds)
        return self.segments[key]

    def _judge_segments(self, lab: Lab, profile: str, workers: int, seconds: float | None) -> dict[str, Any] | None:
        from squall.calibration.segments import calibrate_profile_over

        assert lab.cluster is not None and lab.shaper is not None
        try:
            report = calibrate_profile_over(profile, lab.cluster, lab.shaper, workers,
                                            seconds if seconds is not None else 60.0, policy=self.fidelity.policy)
            return report.to_dict() if report is not None else None
        except Exception as exc:  # a run is not refused for it: the report says it is missing
            logger.warning("%s: the per-segment calibration failed: %s", profile, exc)
            return None

    # -- the end --------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close every lab, each even when another one's teardown failed; the first failure is raised."""
        labs = list(self.labs.values())
        self.labs.clear()
        errors: list[BaseException] = []
        for lab in labs:
            try:
                lab.close()
            except Exception as exc:
                errors.append(exc)
        for made in self._made:
            close = getattr(made, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:  # a display that cannot close leaves nothing behind
                    logger.debug("closing a display failed: %s", exc)
        self._made.clear()
        if self._own_snapshots and self._snapshot_root is not None:
            shutil.rmtree(self._snapshot_root, ignore_errors=True)
            self._snapshot_root = None
        if errors:
            raise errors[0]

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except Exception as close_exc:
            if exc is None:
                raise
            # the run's own error says why it failed; what teardown left behind is for 'squall gc'
            logger.error("%s", close_exc)


def _with_segments(trace: RunTrace, segments: dict[str, Any] | None) -> RunTrace:
    if segments is None:
        return trace
    return dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, segments=segments))


def _inside(path: Path, folder: Path) -> tuple[str, ...]:
    """``path`` relative to ``folder`` when it lies inside it (as an exclude pattern), else nothing."""
    try:
        rel = path.resolve().relative_to(folder.resolve())
    except ValueError:
        return ()
    return (str(rel),) if str(rel) != "." else ()
