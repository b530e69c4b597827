"""How long a class takes: N submissions (copies of the sample class), graded, then graded again unchanged.

    .venv/bin/python tools/bench_class.py 100 --jobs 6 [--course /tmp/class100] [--keep]

Student k gets the k-th sample of assignments/submitted/ in turn (a complete notebook, a loop over
heads, a wrong gathering step, the untouched release, a forward that never returns), so the class has
the sample class's mix. It prints the load average before and after (the figures mean little on a
busy machine), the wall time of the first `grade-class` run and of a second one with nothing
changed, the per-student statuses found, and the scores each sample's copies got.

The cost is also said in torch imports: the wall time of `import torch` in a fresh interpreter, measured in the
same run (the median of three, before and after the class), is the unit a grading's start costs at least. And the
CPU time of the first run per submission, by where it goes: the whole machine's busy CPU time during the run
(/proc/stat: on an otherwise idle machine, the class's), of which the submissions' own workers (`results.json`'s
`resources.worker_cpu_seconds`), the rest being the grader's (its grading processes: the checks, the reference,
the timing workers, the captures replayed, every start). Workers forked from a fork server are not children the
kernel counts for `grade-class`, so its own rusage would miss them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_class(course: Path, size: int) -> None:
    samples = sorted(p for p in (ROOT / "assignments" / "submitted").glob("*/mha/mha.*"))
    for k in range(size):
        sample = samples[k % len(samples)]
        folder = course / "submitted" / f"s{k:03d}-{sample.parent.parent.name}" / "mha"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(sample, folder / sample.name)


def torch_import_seconds() -> float:
    """The wall time of `import torch` in a fresh interpreter: the median of three."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.monotonic() - started)
    return statistics.median(times)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since it started, all CPUs together (/proc/stat: user, nice,
    system, irq, softirq and steal time)."""
    with open("/proc/stat") as handle:
        ticks = [int(x) for x in handle.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def workers_cpu(course: Path) -> float:
    """CPU seconds the submissions' own workers used, as each results.json says."""
    total = 0.0
    for path in (course / "results").glob("*/mha/results.json"):
        total += float(
            ((json.loads(path.read_text()).get("extra_data") or {}).get("resources") or {}).get(
                "worker_cpu_seconds", 0.0
            )
        )
    return total


def grade(course: Path, jobs: int, extra: list[str]) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade-class",
            str(course),
            "--device",
            "cpu",
            "--jobs",
            str(jobs),
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - started
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise SystemExit(f"grade-class exited {done.returncode}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", type=int)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--course", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the course folder")
    args = parser.parse_args()
    course = args.course or Path(tempfile.mkdtemp(prefix="mha-class-"))
    if (course / "submitted").exists():
        raise SystemExit(f"{course} already has a submitted/ folder; choose another --course")
    make_class(course, args.size)
    before = torch_import_seconds()
    print(
        f"{args.size} submissions in {course}; {os.cpu_count()} CPUs; load average before: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    cpu_before = machine_busy_seconds()
    first = grade(course, args.jobs, [])
    cpu = machine_busy_seconds() - cpu_before
    workers = workers_cpu(course)
    load_after = os.getloadavg()
    second = grade(course, args.jobs, [])
    rows = list(csv.DictReader((course / "grades.csv").open()))
    statuses = Counter(row["status"] for row in rows)
    scores: dict[str, Counter] = {}  # by sample: the scores its copies got (the same, unless timing differs)
    for row in rows:
        scores.setdefault(row["student"].split("-", 1)[-1], Counter())[row["score"]] += 1
    print(
        f"first run (--jobs {args.jobs}): {first:.1f} s ({first / args.size:.2f} s per submission); "
        f"load average after it: {' '.join(f'{x:.2f}' for x in load_after)}"
    )
    unit = statistics.median([before, torch_import_seconds()])
    print(
        f"in torch imports: the first run took {first / unit:.0f} (one import: {unit:.2f} s, measured before and "
        "after the class)"
    )
    print(
        f"CPU per submission (first run): {cpu / args.size:.2f} s in all (the machine's busy time): the "
        f"submissions' own workers {workers / args.size:.2f} s, the grader's processes and the rest of the machine "
        f"{(cpu - workers) / args.size:.2f} s"
    )
    print(f"re-run with nothing changed: {second:.2f} s")
    print("statuses: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    for sample, counts in sorted(scores.items()):
        print(f"  {sample}: " + ", ".join(f"{n} x {score}" for score, n in counts.most_common()))
    if not args.keep and args.course is None:
        shutil.rmtree(course)
    return 0


if __name__ == "__main__":
    sys.exit(main())
