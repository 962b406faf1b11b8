"""A program's hang on an engine whose ranks' processes are not in this machine's /proc: no stack, said plainly."""

from __future__ import annotations

from squall.experiment.driver import ExperimentError
from squall.experiment.hangs import HangWatch, Running


def test_a_stack_that_cannot_be_taken_is_recorded_with_the_reason_and_the_dump_goes_on() -> None:
    def pid_of(rank: int) -> int:
        if rank == 1:
            raise ExperimentError("not taken on the swarm engine (py-spy runs on this machine, the rank on node n2)")
        return 0  # no such process: py-spy's own error

    watch = HangWatch(after_s=None, start_wall=0.0, lines=list, bytes_seen=list,
                      running=lambda: [Running(1, 0, None)], pid_of=pid_of, depth=2, stop=lambda: None)
    [stack] = watch.dump("hung")
    assert stack.rank == 1 and stack.why == "hung" and not stack.text
    assert stack.error == "not taken on the swarm engine (py-spy runs on this machine, the rank on node n2)"
