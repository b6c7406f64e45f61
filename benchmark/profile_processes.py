"""How busy each server process was, from a py-spy recording of the whole process tree.

py-spy's raw output (`py-spy record --subprocesses --format raw --nonblocking`) has one line per
distinct stack with its sample count; the first frame names the process and later frames name
threads' functions. For each process this prints the samples of each thread's stacks as a share of
the recording (seconds x rate: 100% is one thread busy the whole time, so a saturated single
thread shows as ~100%) and its functions with the most self samples. A child process's stacks
come under its parent's process frame; the last process frame of a stack names its process. A process that holds a thread
near 100% is the one that caps throughput.

  python benchmark/profile_processes.py OUT/frontend.collapsed --seconds 10 --rate 200
"""

from __future__ import annotations

import argparse
import collections


def read(path: str) -> list[tuple[str, list[str], int]]:
    """(process frame, its Python frames outermost first, samples) per stack of a raw recording."""
    stacks = []
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            # A child's stacks come under its parent's process frame: the last process frame names it.
            at = max(i for i, frame in enumerate(frames) if frame.startswith("process "))
            process, frames = frames[at], frames[at + 1 :]
            while frames and frames[0].endswith('"'):  # the rest of a command line that held a ';'
                frames = frames[1:]
            stacks.append((process, frames, int(count)))
    return stacks


def short(frame: str) -> str:
    """'func (path/to/file.py:12)' -> 'func file.py:12'."""
    name, _, where = frame.partition(" (")
    return f"{name} {where.rstrip(')').rsplit('/', 1)[-1]}"


def process_label(frame: str) -> str:
    """py-spy's 'process 123:"python -m sglang.launch_server ..."' -> 'process 123: <role>'."""
    head, _, command = frame.partition(":")
    for role in ("launch_server", "spawn_main", "bench_serving"):
        if role in command:
            return f"{head}: {role}"
    return f"{head}: {command[:60]}"


def summarise(stacks: list[tuple[str, list[str], int]], seconds: float, rate: float, top: int) -> list[str]:
    per_process: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for process, frames, n in stacks:
        # The outermost Python frame tells the threads apart (main module vs Thread._bootstrap).
        threads[process][short(frames[0]) if frames else "?"] += n
        if frames:
            per_process[process][short(frames[-1])] += n
    budget = seconds * rate
    lines = []
    for process, own in sorted(per_process.items(), key=lambda item: -sum(item[1].values())):
        lines.append(f"{process_label(process)}: {100 * sum(own.values()) / budget:.0f}% of one thread")
        for thread, n in threads[process].most_common(4):
            lines.append(f"    thread from {thread}: {100 * n / budget:.0f}%")
        for name, n in own.most_common(top):
            lines.append(f"    {100 * n / budget:5.1f}%  {name}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("collapsed")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    print("\n".join(summarise(read(args.collapsed), args.seconds, args.rate, args.top)))


if __name__ == "__main__":
    main()
