"""On the CPU the scheduler process (all its threads, the forward's OpenMP team among them) runs
at a lower priority than the HTTP process, so streamed results go out while a step computes."""

from __future__ import annotations

import os
import re

import pytest

from engine_utils import generate_ok, greedy, running_server
from sglang.srt.managers.scheduler_process import CPU_SCHEDULER_NICE

pytestmark = pytest.mark.e2e


def _nice_of_threads(pid: int) -> dict[int, int]:
    """{thread id: nice} of a process (field 19 of /proc/<pid>/task/<tid>/stat)."""
    nices = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        nices[int(tid)] = int(after_name[16])
    return nices


def test_cpu_scheduler_threads_run_below_the_front_end() -> None:
    with running_server("--log-level", "info") as server:
        generate_ok(server, "The capital of France is", sampling_params=greedy(4))  # the forward's threads exist
        (scheduler_pid,) = map(int, re.findall(r"TP rank 0 of 1: pid (\d+)", server.output))
        front = _nice_of_threads(server.proc.pid)
        scheduler = _nice_of_threads(scheduler_pid)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert set(front.values()) == {base}, front
    assert len(scheduler) >= 3, scheduler  # main, forward worker, OpenMP
    assert set(scheduler.values()) == {min(base + CPU_SCHEDULER_NICE, 19)}, scheduler
