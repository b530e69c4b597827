"""Helpers for the project's tests: grading a file end to end, as an instructor would, and reading results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from autograder.course.grading_pool import Grader, GradingJob, JobAnswer
from autograder.model import GradingRun
from autograder.rubric import DEFAULT_RUBRIC

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference" / "mha.py"
SAMPLES = ROOT / "assignments" / "submitted"  # the sample class, one folder per student


def autograder(
    *args: object, cwd: Path = ROOT, timeout: float = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m autograder ARGS...` in a separate process, as a user runs it; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "autograder", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def grade(path: Path, out_dir: Path, *extra: str, timeout: float = 300) -> tuple[dict, subprocess.CompletedProcess]:
    """Run `python -m autograder grade` on `path` in a separate process; return results.json and the run."""
    out = out_dir / f"{Path(path).stem}-results.json"
    run = autograder("grade", path, "--out", out, "--quiet", *extra, cwd=out_dir, timeout=timeout)
    assert out.exists(), f"no results.json was written\nstdout: {run.stdout}\nstderr: {run.stderr}"
    return json.loads(out.read_text()), run


class FakeGrader:
    """A stand-in for a class run's grading process (`grading_pool.Grader`, which tests replace in
    `grade_class`): nothing is graded. A request's results.json is `run_for(request)`'s run, a graded one unless
    a subclass says otherwise; `run_for` may raise as a grading process would (KeyboardInterrupt: a Ctrl-C)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env

    def run_for(self, request: GradingJob) -> GradingRun:
        return GradingRun(status="graded", submission="mha.py")

    def grade(self, request: GradingJob, timeout: float) -> JobAnswer:
        run = self.run_for(request)  # before the file is opened: a stopped grading leaves none
        with open(request.out, "w") as handle:
            json.dump(run.to_gradescope(), handle)
        return JobAnswer(ok=True)

    def close(self) -> None:
        pass


class GradingPool:
    """Grades many files in long-lived grading processes (`autograder.course.grading_pool`, as grade-class
    does), one per thread that uses it: Python, torch, pytest and the reference's timing workers are started
    once per process instead of once per submission. Every submission still gets fresh workers."""

    def __init__(self):
        self.local = threading.local()
        self.graders: list[Grader] = []

    def grade(
        self,
        path: Path,
        out_dir: Path,
        parts: list[str] | None = None,
        rubric: Path | None = None,
        timeout: float = 600,
    ) -> tuple[dict, JobAnswer]:
        grader = getattr(self.local, "grader", None)
        if grader is None:
            grader = self.local.grader = Grader()
            self.graders.append(grader)
        out = out_dir / f"{Path(path).stem}-results.json"
        job = GradingJob(
            id=str(path),
            submission=Path(path),
            out=out,
            device="auto",
            rubric=rubric or DEFAULT_RUBRIC,
            parts=tuple(parts) if parts else None,
        )
        outcome = grader.grade(job, timeout)
        assert out.exists(), f"no results.json was written: {outcome.problem}"
        return json.loads(out.read_text()), outcome

    def close(self):
        for grader in self.graders:
            grader.close()


def class_results(course: Path, students) -> dict[str, dict]:
    """The results.json a class run wrote for each of `students` that has one."""
    found = {}
    for student in students:
        path = course / "autograded" / student / "mha" / "results.json"
        if path.exists():
            found[student] = json.loads(path.read_text())
    return found


def part_scores(results: dict) -> dict[str, tuple[float, float]]:
    """{part: (score, max_score)}, rounded to 2 decimals."""
    totals: dict[str, list[float]] = {}
    for test in results["tests"]:
        entry = totals.setdefault(test["tags"][0], [0.0, 0.0])
        entry[0] += test["score"]
        entry[1] += test["max_score"]
    return {part: (round(s, 2), round(m, 2)) for part, (s, m) in totals.items()}


def checks_run(results: dict) -> int:
    """How many checks (cases of a parametrised check counted one by one) a results.json reports: a row
    stands for the cases of one check that came out the same way."""
    return sum(len((t.get("extra_data") or {}).get("cases") or [None]) for t in results["tests"])


def failures(results: dict, part: str | None = None) -> list[dict]:
    return [t for t in results["tests"] if t["status"] == "failed" and (part is None or t["tags"][0] == part)]


def mutated_reference(tmp_path: Path, name: str, old: str, new: str, count: int = 1) -> Path:
    """reference/mha.py with `old` replaced by `new` (which must occur exactly `count` times)."""
    source = REFERENCE.read_text()
    assert source.count(old) == count, f"{name}: {old!r} occurs {source.count(old)} times in reference/mha.py"
    path = tmp_path / name / "mha.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source.replace(old, new))
    return path


def course_of_samples(course: Path, students: dict[str, str]) -> Path:
    """A course whose students hand in copies of the sample class's submissions: {student: sample}."""
    for student, sample in students.items():
        source = next((SAMPLES / sample / "mha").iterdir())
        target = course / "submitted" / student / "mha" / source.name
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
    return course


def wait_until(condition, seconds: float = 10.0, interval: float = 0.05) -> bool:
    """Poll `condition` until it holds (True) or `seconds` have passed (False): readiness, or an end, waited on
    rather than slept through."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True
