"""Where the time of grading one submission goes, measured in one long-lived grading process.

    .venv/bin/python tools/profile_grading.py [FILE ...] [--rounds 2] [--profile out.prof]

For a fresh grader process it measures the start-up (interpreter, torch, pytest and the grader's
imports); then it grades each FILE (default: the sample class) `rounds` times in this process, as a
`grade-class` grading process does, and splits each run into: starting the worker until it says
ready (its interpreter and torch import), loading the submission, and the checks; with the CPU time
of the grader and of the worker. `--profile` writes a cProfile of the grading runs (snakeviz, pstats).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def startup() -> tuple[float, float]:
    """(wall, CPU) seconds of a fresh `python -c "import autograder.grading.grade"`: what one grader process costs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import autograder.grading.grade"], check=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic() - started, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu(usage) -> float:
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    files = args.files or sorted((ROOT / "assignments" / "submitted").glob("*/mha/mha.*"))
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    wall, used = startup()
    print(f"a fresh grader process (python, torch, pytest, autograder imports): {wall:.2f} s wall, {used:.2f} s CPU")

    from autograder.grading.grade import Options, grade_submission
    from autograder.grading.timing import KeptWorkers
    from autograder.sandbox import client

    phases: dict[str, float] = {}
    original_ready, original_start = client.Worker._ready, client.Worker.start

    def wait_ready(self, *more, **named):
        started = time.monotonic()
        try:
            return original_ready(self, *more, **named)
        finally:
            key = "worker start (python + torch, to ready)"
            phases[key] = phases.get(key, 0.0) + time.monotonic() - started

    def start(self, *more, **named):
        started = time.monotonic()
        try:
            return original_start(self, *more, **named)
        finally:
            phases["worker start + load"] = phases.get("worker start + load", 0.0) + time.monotonic() - started

    worker_cpu = [0.0]
    original_kill = client.Worker.kill

    def kill(self):
        if self.process is not None:
            worker_cpu[0] += self.process.cpu_seconds()  # its whole process tree, read before it is killed
        return original_kill(self)

    client.Worker._ready, client.Worker.start, client.Worker.kill = wait_ready, start, kill
    client.Worker.close = kill
    profiler = cProfile.Profile() if args.profile else None
    rows = []
    kept = KeptWorkers()  # the reference's timing workers, kept from one grading to the next as `make grade` does
    for round_number in range(args.rounds):
        for file in files:
            phases.clear()
            grader_before, worker_cpu[0] = cpu(resource.getrusage(resource.RUSAGE_SELF)), 0.0
            started = time.monotonic()
            if profiler:
                profiler.enable()
            run = grade_submission(
                file, Options(device="cpu", out=Path("/nonexistent/results.json"), quiet=True, kept_workers=kept)
            )
            if profiler:
                profiler.disable()
            total = time.monotonic() - started
            ready = phases.get("worker start (python + torch, to ready)", 0.0)
            load = phases.get("worker start + load", 0.0) - ready
            rows.append(
                (
                    round_number,
                    file.parent.parent.name,
                    total,
                    ready,
                    load,
                    total - ready - load,
                    cpu(resource.getrusage(resource.RUSAGE_SELF)) - grader_before,
                    worker_cpu[0],
                    run.score,
                )
            )
    kept.close()
    print(
        f"{'round':>5} {'student':<8} {'total':>6} {'worker':>7} {'load':>6} {'checks':>7} {'grader':>7} "
        f"{'worker':>7} {'score':>6}"
    )
    print(f"{'':>5} {'':<8} {'wall s':>6} {'start s':>7} {'s':>6} {'s':>7} {'CPU s':>7} {'CPU s':>7}")
    for row in rows:
        print(
            f"{row[0]:>5} {row[1]:<8} {row[2]:6.2f} {row[3]:7.2f} {row[4]:6.2f} {row[5]:7.2f} {row[6]:7.2f} "
            f"{row[7]:7.2f} {row[8]:6g}"
        )
    later = [r for r in rows if r[0] > 0] or rows
    print(
        f"mean over rounds after the first: {sum(r[2] for r in later) / len(later):.2f} s wall, "
        f"{sum(r[6] + r[7] for r in later) / len(later):.2f} s CPU (grader + worker) per submission"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if profiler:
        profiler.dump_stats(args.profile)
        print(f"profile: {args.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
