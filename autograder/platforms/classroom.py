"""GitHub Classroom: grade a student repository and report the points Classroom reads.

    python -m autograder.platforms.classroom SUBMISSION_DIR --out results.json >> "$GITHUB_OUTPUT"

finds the submission in the student's checkout and grades it into results.json exactly as
Gradescope's adapter does (`platforms.folder.grade_folder`: `mha.ipynb` or `mha.py`, else the one
notebook or .py file, never through a link out of the checkout), and prints `result=<base64 JSON>`: the runner result that GitHub Classroom's grading
reporter (`classroom-resources/autograding-grading-reporter`) reads from the environment and turns
into the check run's "Points X/Y", which is what Classroom records. One test per part, with the
part's score, so students see where their points went.

Points in hundredths (`SCALE`): the reporter (v1) adds the tests' scores as JavaScript numbers and
prints the sum in its "Points X/Y" notice, so 87.14 of 100 made of parts such as 17.14 can come out as
87.13999999999999, and Classroom has only ever been sent whole points ("Points 87/100"). Its log's
table and "Total points" line count passed tests instead (for 87.14 with 6 of 8 parts passed it shows
75/100). So every score in the runner result is a whole number of hundredths of a point: Classroom
records "Points 8714/10000" for 87.14 of 100, exactly our fraction, and the parts add up to the
total exactly. This runner prints the score in points to the log itself.

The workflow that runs it is `deploy/github-classroom/.github/workflows/classroom.yml` (documented in
docs/github-classroom.md): it checks the grader out of the instructor's private repository with a
secret, so the student's repository never holds the reference.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from autograder.model import HUNDREDTHS, GradingRun, hundredths, points_text
from autograder.platforms.folder import grade_folder

SCALE = HUNDREDTHS  # Classroom's points are hundredths of ours: whole numbers, with nothing rounded away


def scaled_part_scores(run: GradingRun) -> list[int]:
    """Each part's score in hundredths: every score is a whole number of hundredths already
    (`scoring.allocate_points`), so they add up to the run's score exactly."""
    return [hundredths(part.score) for part in run.parts()]


def runner_result(run: GradingRun) -> dict[str, Any]:
    """The grading reporter's runner result: status, max_score, and one test per part with its score,
    all in hundredths of a point (`SCALE`). A run that could not grade reports no points at all (the
    reporter then records nothing in Classroom: never a zero that is the grader's fault)."""
    if not run.graded:
        return {
            "version": 1,
            "status": "error",
            "max_score": 0,
            "tests": [
                {
                    "name": "grading",
                    "status": "error",
                    "score": 0,
                    "message": run.reason,
                    "line_no": 0,
                    "execution_time": f"{run.execution_time:.1f}s",
                }
            ],
        }
    tests = []
    for part, points in zip(run.parts(), scaled_part_scores(run)):
        failure = part.first_failure
        message = (
            ""
            if failure is None
            else (failure.message if failure.visibility == "visible" else "details are shown after the due date")
        )
        tests.append(
            {
                "name": f"{part.title}: {points_text(part.score)} of {points_text(part.max_score)} points",
                "status": "pass" if failure is None else "fail",
                "score": points,
                "message": message,
                "line_no": 0,
                "execution_time": "",
            }
        )
    status = "pass" if all(t["status"] == "pass" for t in tests) else "fail"
    return {"version": 1, "status": status, "max_score": hundredths(run.max_score), "tests": tests}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autograder.platforms.classroom", description=__doc__.splitlines()[0]
    )
    parser.add_argument("submission", type=Path, help="the student's checkout")
    parser.add_argument("--out", type=Path, default=Path("results.json"))
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)

    run = grade_folder(args.submission, args.out, device=args.device)
    encoded = base64.b64encode(json.dumps(runner_result(run)).encode()).decode()
    print(f"result={encoded}")
    if run.graded:
        print(
            f"Score: {points_text(run.score)} of {points_text(run.max_score)} points (Classroom shows it in "
            f"hundredths: Points {hundredths(run.score)}/{hundredths(run.max_score)})",
            file=sys.stderr,
        )
    else:
        print(f"cannot grade: {run.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from autograder.ending import end

    end(main)
