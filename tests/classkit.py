"""Helpers for the class-level tests: courses on disk, grading runs made without grading, and the
record filled so that `grade-class` finds it up to date (only the outputs are then written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autograder.contract import PART_IDS
from autograder.course.roster import read_roster
from autograder.course.store import ClassInputs, Record
from autograder.model import FAILED, GRADED, PASSED, CheckResult, GradingRun, SpeedFigures
from autograder.rubric import DEFAULT_RUBRIC, load_rubric

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def make_course(root: Path, files: dict[str, dict[str, str] | None]) -> Path:
    """`root/submitted/<student>/mha/<name>` for each student's files; None: no mha/ folder at all."""
    for student, named in files.items():
        folder = root / "submitted" / student
        folder.mkdir(parents=True, exist_ok=True)
        if named is None:
            continue
        (folder / "mha").mkdir(exist_ok=True)
        for name, text in named.items():
            (folder / "mha" / name).write_text(text)
    return root


def synthetic_run(
    submission: str,
    scores: dict[str, float] | None = None,
    *,
    checks: list[CheckResult] | None = None,
    status: str = GRADED,
    reason: str = "",
    speed: SpeedFigures | None = None,
) -> GradingRun:
    """A graded run with one check per part scoring `scores[part]` of the rubric's points (default full)."""
    rubric = load_rubric()
    if checks is None:
        checks = []
        for part in PART_IDS:
            if part not in rubric.parts:
                continue
            points = rubric.part_points(part)
            score = points if scores is None else scores.get(part, points)
            checks.append(
                CheckResult(
                    key=f"{part}::test_all",
                    part=part,
                    name=f"everything in {part}",
                    status=PASSED if score >= points else FAILED,
                    score=score,
                    max_score=points,
                    message="" if score >= points else f"{part} went wrong",
                )
            )
    return GradingRun(
        status=status,
        submission=submission,
        device="cpu",
        isolation="process",
        seed=1,
        reason=reason,
        checks=checks if status == GRADED else [],
        speed=speed,
        titles={p: rubric.part_title(p) for p in rubric.parts},
    )


def fill_record(course: Path, runs: dict[str, GradingRun], device: str = "cpu"):
    """Store `runs` with the inputs `grade-class --device DEVICE` would compute: they are up to date."""
    inputs = ClassInputs.compute(DEFAULT_RUBRIC, device)
    record = Record(course)
    for entry in read_roster(course):
        if entry.student in runs:
            record.save_run(entry.student, runs[entry.student])
            record.save_inputs(entry.student, inputs.for_file(entry.file))


def nbgrader(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """One of nbgrader's own commands, as an instructor runs it (the virtualenv's bin/ on PATH)."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(BIN / "nbgrader"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
