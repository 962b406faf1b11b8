"""``squall profiles``: list the network profiles, show one resolved for N workers, validate files.

Also runnable on its own: ``python -m squall.cli.profiles profiles show wan-5ms --workers 4``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from squall.assets import AssetError
from squall.profiles import (
    Chance,
    LinkSpec,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
    profile_dirs,
)
from squall.profiles.link_traces import row_cells
from squall.profiles.profile import TracedScope
from squall.profiles.units import (
    UnitError,
    format_duration_us,
    format_probability,
    format_rate_bps,
    parse_seconds,
)

DEFAULT_WORKERS = 4  # `show` without --workers
VALIDATE_WORKERS = (2, 4, 8, 16)  # `validate` without --workers (those the profile supports)
DEFAULT_DURATION_S = 600.0  # `show` expands random churn over this long
EXIT_USAGE = 2  # an invalid profile is bad input (README: exit codes)
EXIT_ENVIRONMENT = 3  # no profile at all: the installation is incomplete (README: exit codes)
EXIT_BROKEN_PIPE = 128 + 13  # the reader went away (`squall profiles list | head`), as SIGPIPE reports it


def add_subparser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``profiles list|show|validate`` on a parent command's sub-parsers."""
    parser = subparsers.add_parser("profiles", help="network profiles: list, show, validate")
    sub = parser.add_subparsers(dest="profiles_command", metavar="COMMAND", required=True)

    listing = sub.add_parser("list", help="the profiles reachable by name")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=cmd_list)

    show = sub.add_parser("show", help="a profile resolved for N workers: links, churn, devices")
    show.add_argument("profile", metavar="NAME_OR_FILE")
    show.add_argument("--workers", "-n", type=int, help=f"cluster size (default {DEFAULT_WORKERS} or more)")
    show.add_argument("--duration", type=_duration, default=DEFAULT_DURATION_S, help="run length for churn")
    show.add_argument("--json", action="store_true", help="print JSON instead of tables")
    show.add_argument("--rows", type=int, default=SHOWN_ROWS, metavar="N",
                      help=f"trace rows to print per trace (default {SHOWN_ROWS}; 0: all)")
    show.set_defaults(func=cmd_show)

    validate = sub.add_parser("validate", help="check profile files; exit 2 if any is invalid")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument(
        "--workers",
        "-n",
        type=int,
        action="append",
        help="cluster size to check (repeatable; default 2 4 8 16)",
    )
    validate.set_defaults(func=cmd_validate)


SHOWN_ROWS = 12  # trace rows `show` prints per trace unless told


def _duration(text: str) -> float:
    """argparse type for durations such as 600s or 10min."""
    try:
        return parse_seconds(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_list(args: argparse.Namespace) -> int:
    """``profiles list``."""
    infos = list_profiles()
    if not infos:  # Squall ships profiles: none found means a broken install, never "nothing to list"
        looked = ", ".join(str(d) for d in profile_dirs())
        sys.stderr.write(f"error: no network profiles found (looked in {looked}); Squall's shipped profiles are "
                         "missing: reinstall it (pip install --force-reinstall squall) or run from a checkout\n")
        return EXIT_ENVIRONMENT
    if args.json:
        rows = [{"name": i.name, "path": str(i.path), "description": i.description} for i in infos]
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table([["NAME", "DESCRIPTION"], *([i.name, i.description] for i in infos)]))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """``profiles show NAME_OR_FILE``."""
    try:
        profile = load_profile(args.profile)
        n = args.workers or max(DEFAULT_WORKERS, profile.required_workers())
        warnings = profile.validate_for(n)
        data = _resolved(profile, n, args.duration)
    except ProfileError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    if args.json:
        print(json.dumps({**data, "warnings": warnings}, indent=2))
        return 0
    print(_report(profile, n, args.duration, warnings, args.rows))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """``profiles validate FILE...``: one line per file, exit 2 (bad input) when any is invalid."""
    bad = 0
    for path in args.files:
        try:
            profile = load_profile(Path(path))
            sizes = args.workers or profile.sizes_to_check(VALIDATE_WORKERS)  # the smallest it needs, then above
            warnings = [w for n in sizes for w in profile.validate_for(n)]
        except ProfileError as exc:
            bad += 1
            print(f"INVALID {exc}")  # the message starts with the file
            continue
        need = profile.worker_need()
        needs = f"; needs at least {need.workers} ({need.reason()})" if need.workers > 2 else ""
        print(f"ok      {path} ({profile.name}; checked for {', '.join(map(str, sizes))} workers{needs})")
        for warning in dict.fromkeys(warnings):
            print(f"  warning: {warning}")
    return EXIT_USAGE if bad else 0


def _resolved(profile: Profile, n: int, duration: float) -> dict[str, object]:
    """Everything `show` prints, as plain data."""
    epochs = []
    for phase in (None, *profile.phases):
        at = phase.at_s if phase else 0.0
        links = [{"src": s, "dst": d, **spec.to_dict()} for (s, d), spec in profile.links(n, at).items()]
        node_links = [{"node": i, **vars(profile.node_link(i, n, at))} for i in range(n)]
        epochs.append({"at_s": at, "phase": phase.name if phase else "", "links": links, "nodes": node_links})
    return {
        "name": profile.name,
        "description": profile.description,
        "source": profile.source,
        "workers": n,
        "regions": {str(i): profile.region_of(i, n) for i in range(n)},
        "epochs": epochs,
        "churn": [event.to_dict() for event in profile.churn_events(n, duration)],
        "devices": [profile.device(i, n).to_dict() for i in range(n)],
        "traces": [_trace_data(scope) for scope in profile.traced_scopes()],
        "change_times_s": list(profile.change_times(duration)),
    }


def _trace_data(scope: TracedScope) -> dict[str, object]:
    """A traced scope as plain data: where, which file, and every row in the profile's units."""
    trace = scope.trace
    return {
        "scope": scope.patch.origin.key,
        "file": trace.file,
        "start_s": scope.start_us / 1e6,
        "end_s": None if scope.end_us is None else scope.end_us / 1e6,
        "loop_s": None if trace.loop_us is None else trace.loop_us / 1e6,
        "columns": ["time", *trace.columns],
        "rows": [row_cells(trace, row) for row in trace.rows],
    }


def _traces_report(profile: Profile, rows_shown: int) -> list[str]:
    """Each traced scope: what it replays, from when, and its rows (the first ``rows_shown``; 0: all)."""
    out: list[str] = []
    for scope in profile.traced_scopes():
        trace = scope.trace
        until = f" until {scope.end_us / 1e6:g}s" if scope.end_us is not None else ""
        out += ["", f"trace at {scope.patch.origin.key} from {scope.start_us / 1e6:g}s{until}: {trace.describe()}"]
        rows = trace.rows if rows_shown <= 0 else trace.rows[:rows_shown]
        table = [["TIME", *(column.upper() for column in trace.columns)]]
        table += [row_cells(trace, row) for row in rows]
        out.append(format_table(table))
        if len(rows) < len(trace.rows):
            out.append(f"... {len(trace.rows) - len(rows)} more rows (--rows 0 prints all)")
    return out


def _report(profile: Profile, n: int, duration: float, warnings: list[str], rows_shown: int = SHOWN_ROWS) -> str:
    """The human-readable form of `show`."""
    out = [f"{profile.name}: {profile.description}", f"source: {profile.source}", f"workers: {n}"]
    if profile.regions.regions:
        members = {r.name: sorted(r.nodes.nodes(n)) for r in profile.regions.regions}
        out.append(
            "regions: " + "; ".join(f"{k} = {', '.join(map(str, v)) or '-'}" for k, v in members.items())
        )
    for phase in (None, *profile.phases):
        at = phase.at_s if phase else 0.0
        title = f"phase {phase.name or phase.origin.key}" if phase else "base"
        out += ["", f"links from {at:g}s ({title}):", _links_table(profile.links(n, at))]
        shared = [(i, profile.node_link(i, n, at)) for i in range(n)]
        shared = [(i, s) for i, s in shared if s.uplink_bps or s.downlink_bps]
        if shared:
            rows = [[str(i), _rate(s.uplink_bps), _rate(s.downlink_bps)] for i, s in shared]
            out += ["shared node rates:", format_table([["NODE", "UPLINK", "DOWNLINK"], *rows])]
    out += _traces_report(profile, rows_shown)
    events = profile.churn_events(n, duration)
    out += ["", f"churn in the first {duration:g}s: {len(events) or 'none'}"]
    if events:
        rows = [
            [f"{e.at_s:.3f}s", e.kind.value, _targets(e.nodes, e.links, e.groups), e.origin] for e in events
        ]
        out.append(format_table([["AT", "KIND", "TARGETS", "FROM"], *rows]))
    out += ["", "devices:", _devices_table(profile, n)]
    out += [f"warning: {w}" for w in warnings]
    return "\n".join(out)


def _links_table(links: dict[tuple[int, int], LinkSpec]) -> str:
    """One row per directed link."""
    header = ["LINK", "DELAY", "JITTER", "LOSS", "DUPLICATE", "REORDER", "RATE", "LIMIT"]
    rows = [header]
    for (src, dst), spec in links.items():
        jitter = spec.jitter
        jitter_text = "-"
        if jitter.amount_us:
            jitter_text = f"{format_duration_us(jitter.amount_us)} {jitter.distribution.value}"
            jitter_text += f" c{format_probability(jitter.correlation)}" if jitter.correlation else ""
        loss = spec.loss
        loss_text = _chance(Chance(loss.probability, loss.correlation))
        if loss.gemodel:
            ge = loss.gemodel
            loss_text = (
                f"ge p={format_probability(ge.p)} r={format_probability(ge.r)} "
                f"1-h={format_probability(ge.loss_bad)} 1-k={format_probability(ge.loss_good)} "
                f"(~{format_probability(round(ge.mean_loss, 5))})"
            )
        rows.append(
            [
                f"{src}->{dst}",
                format_duration_us(spec.delay_us) if spec.delay_us else "0",
                jitter_text,
                loss_text,
                _chance(spec.duplicate),
                _chance(spec.reorder),
                _rate(spec.rate_bps),
                str(spec.limit_packets or "auto"),
            ]
        )
    return format_table(rows)


def _devices_table(profile: Profile, n: int) -> str:
    """One row per node; MB NOISE and MEAN MB FACTOR are per micro-batch (gradient accumulation)."""
    from squall.training.device import DeviceModel

    rows = [["NODE", "STEP TIME", "SLOWDOWN", "STRAGGLER", "NOISE SIGMA", "MB NOISE", "MEAN FACTOR", "MEAN MB FACTOR"]]
    for node in range(n):
        d = profile.device(node, n)
        model = DeviceModel.from_config(d.to_dict(), node=node)
        straggler = (
            f"{d.straggler_probability:.1%} x{d.straggler_factor:g}" if d.straggler_probability else "-"
        )
        step = f"{d.step_time_s * 1000:g}ms" if d.step_time_s is not None else "task's own"
        noise = f"{d.noise_sigma:g}" if d.noise_sigma else "-"
        microbatch = f"{d.microbatch_noise} x{d.microbatch_delay_factor:g}" if model.microbatch_varies else "-"
        rows.append(
            [
                str(node),
                step,
                f"{d.slowdown:g}x",
                straggler,
                noise,
                microbatch,
                f"{model.mean_factor:.3f}",
                f"{model.mean_microbatch_factor:.3f}",
            ]
        )
    return format_table(rows)


def _chance(chance: Chance) -> str:
    """``1%``, ``1% c25%`` or ``-``."""
    if not chance.probability:
        return "-"
    text = format_probability(chance.probability)
    return text + (f" c{format_probability(chance.correlation)}" if chance.correlation else "")


def _rate(bits: int | None) -> str:
    return format_rate_bps(bits) if bits else "unlimited"


def _targets(
    nodes: tuple[int, ...], links: tuple[tuple[int, int], ...], groups: tuple[tuple[int, ...], ...]
) -> str:
    """A churn event's targets in a few characters."""
    if nodes:
        return "nodes " + ", ".join(map(str, nodes))
    if links:
        return "links " + ", ".join(f"{a}->{b}" for a, b in links)
    if groups:
        return "groups " + " | ".join(",".join(map(str, g)) for g in groups)
    return "-"


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m squall.cli.profiles profiles ...``."""
    parser = argparse.ArgumentParser(prog="squall", description=__doc__)
    add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        code: int = args.func(args)
    except AssetError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_ENVIRONMENT
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
