"""Grade one class three ways and compare: locally in one run, as N local shard processes then a
merge, and as an N-task Slurm job array then its merge job (on a one-node Slurm started here).

    .venv/bin/python tools/measure_scaling.py --students 40 --shards 4 --out scaling.json

The class is copies of the sample submissions in assignments/submitted/, dealt in turn. Prints the
wall time of each way, whether every student's grades (score and part by part) are identical to the
local run's, and the time per submission; writes the same as JSON with --out. The Slurm way needs
root and Debian's slurm-wlm packages (see tools/local_slurm.py); --ways local,shards skips it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from local_slurm import LocalSlurm  # noqa: E402

AUTOGRADER = [sys.executable, "-m", "autograder", "grade-class"]


def make_class(course: Path, students: int) -> dict[str, str]:
    samples = sorted(p for p in (ROOT / "assignments" / "submitted").glob("*/mha/mha.*"))
    dealt = {}
    for number in range(students):
        sample = samples[number % len(samples)]
        student = f"s{number + 1:04d}"
        target = course / "submitted" / student / "mha" / sample.name
        target.parent.mkdir(parents=True)
        shutil.copy(sample, target)
        dealt[student] = sample.parent.parent.name
    return dealt


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(map(str, command))} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done


def grade_locally(course: Path, jobs: int):
    run([*AUTOGRADER, course, "--device", "cpu", "--jobs", jobs])


def grade_in_local_shards(course: Path, shards: int, jobs: int):
    processes = [
        subprocess.Popen(
            [*AUTOGRADER, str(course), "--device", "cpu", "--jobs", str(jobs), "--shard", f"{index}/{shards}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(shards)
    ]
    for process in processes:
        _, errors = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a shard failed ({process.returncode}): {errors[-3000:]}")
    run([*AUTOGRADER, course, "--merge"])


def grade_on_slurm(course: Path, shards: int, jobs: int, env: dict, logs: Path) -> dict:
    """Runs submit.sh (waiting for the merge); returns Slurm's own times, in seconds from the array's submission."""
    done = run(
        ["bash", ROOT / "deploy" / "slurm" / "submit.sh"],
        cwd=ROOT,
        env={
            **env,
            "COURSE": str(course),
            "SHARDS": str(shards),
            "CPUS": str(jobs),
            "JOBS": str(jobs),
            "VENV": sys.prefix,
            "LOGS": str(logs),
            "WAIT": "1",
        },
    )
    array_id = re.search(r"array job (\d+)", done.stdout).group(1)
    merge_id = re.search(r"merge job (\d+)", done.stdout).group(1)

    def times(job_id):
        lines = run(["scontrol", "--oneliner", "show", "job", job_id], env=env).stdout.splitlines()
        fields = [dict(item.split("=", 1) for item in line.split() if "=" in item) for line in lines]
        return [
            {k: datetime.fromisoformat(f[k]).timestamp() for k in ("SubmitTime", "StartTime", "EndTime")}
            for f in fields
        ]

    tasks, (merge,) = times(array_id), times(merge_id)
    zero = min(t["SubmitTime"] for t in tasks)
    return {
        "first_task_started": min(t["StartTime"] for t in tasks) - zero,
        "last_task_ended": max(t["EndTime"] for t in tasks) - zero,
        "merge_started": merge["StartTime"] - zero,
        "merge_ended": merge["EndTime"] - zero,
    }


def time_big_merge(graded: Path, course: Path, students: int) -> dict:
    """A class of `students`, each with a copy of one of `graded`'s submissions and its results, merged."""
    sources = sorted(graded.glob("submitted/*/mha/mha.*"))
    for number in range(students):
        source = sources[number % len(sources)]
        student = f"m{number + 1:05d}"
        target = course / "submitted" / student / "mha" / source.name
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
        record = course / "results" / student / "mha"
        record.mkdir(parents=True)
        for name in ("results.json", "inputs.json"):  # the run and the content hashes it was made from
            shutil.copyfile(graded / "results" / source.parent.parent.name / "mha" / name, record / name)
    started = time.monotonic()
    run([*AUTOGRADER, course, "--merge"])
    return {"students": students, "wall_s": round(time.monotonic() - started, 2)}


def grades(course: Path) -> dict[str, dict]:
    with (course / "grades.csv").open(newline="") as handle:
        return {row["student"]: {k: v for k, v in row.items() if k != "note"} for row in csv.DictReader(handle)}


def execution_times(course: Path) -> list[float]:
    return [json.loads(p.read_text())["execution_time"] for p in sorted(course.glob("results/*/mha/results.json"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2, help="grading processes at once in the local run (default 2)")
    parser.add_argument("--ways", default="local,shards,slurm")
    parser.add_argument(
        "--merge-class",
        type=int,
        default=0,
        metavar="M",
        help="also time a merge of M students, made of copies of the first way's results",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    ways = args.ways.split(",")
    cores = os.cpu_count()
    report: dict = {"students": args.students, "shards": args.shards, "cores": cores, "ways": {}}
    with tempfile.TemporaryDirectory(prefix="mha-scaling-") as scratch:
        scratch = Path(scratch)
        for way in ways:
            course = scratch / way
            dealt = make_class(course, args.students)
            report["class"] = {sample: list(dealt.values()).count(sample) for sample in sorted(set(dealt.values()))}
            load_before = os.getloadavg()[0]
            if way == "local":
                started = time.monotonic()
                grade_locally(course, args.jobs)
                how = f"one grade-class run, --jobs {args.jobs}"
            elif way == "shards":
                started = time.monotonic()
                grade_in_local_shards(course, args.shards, 1)
                how = f"{args.shards} grade-class --shard processes at once, --jobs 1 each, then --merge"
            elif way == "slurm":
                with LocalSlurm(scratch / "slurm-state", cores) as env:
                    started = time.monotonic()
                    slurm_times = grade_on_slurm(course, args.shards, 1, env, scratch / "slurm-logs")
                how = (
                    f"submit.sh: a {args.shards}-task array, 1 CPU and --jobs 1 per task ({cores} tasks at once "
                    f"on a {cores}-CPU node), then the merge job"
                )
            else:
                parser.error(f"unknown way {way!r}: local, shards or slurm")
            wall = time.monotonic() - started
            times = execution_times(course)
            report["ways"][way] = {
                "how": how,
                "wall_s": round(wall, 1),
                "wall_per_submission_s": round(wall / args.students, 2),
                "grader_s_per_submission": {"mean": round(sum(times) / len(times), 2), "max": max(times)},
                "load_average_before": round(load_before, 2),
                "load_average_after": round(os.getloadavg()[0], 2),
                "grades": grades(course),
            }
            if way == "slurm":
                report["ways"][way]["slurm_times_s"] = slurm_times
            print(f"{way:7s} {wall:7.1f} s  ({how}; load {load_before:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
        if args.merge_class:
            report["merge_class"] = time_big_merge(scratch / ways[0], scratch / "big", args.merge_class)
            print(f"merge of {args.merge_class} students: {report['merge_class']['wall_s']} s", flush=True)
    baseline = next(iter(report["ways"].values()))["grades"]
    for way, result in report["ways"].items():
        result["grades_identical_to_first"] = result.pop("grades") == baseline
        print(f"{way:7s} grades identical to {ways[0]}: {result['grades_identical_to_first']}")
    report["scores"] = {student: row["score"] for student, row in sorted(baseline.items())}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["grades_identical_to_first"] for r in report["ways"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
