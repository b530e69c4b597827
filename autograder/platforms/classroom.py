"""GitHub Classroom: grade a student repository and report the points Classroom reads.

    python -m autograder.platforms.classroom SUBMISSION_DIR --out results.json >> "$GITHUB_OUTPUT"

finds the submission in the student's checkout and grades it into results.json exactly as
Gradescope's adapter does (`platforms.folder.grade_folder`: `mha.ipynb` or `mha.py`, else the one
notebook or .py file, never through a link out of the checkout), and prints `result=<base64 JSON>`: the runner result that GitHub Classroom's grading
reporter (`classroom-resources/autograding-grading-reporter`) reads from the environment and turns
into the check run's "Points X/Y", which is what Classroom records. One test per part, with the
part's score, so students see where their points went.

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

from autograder.model import GradingRun
from autograder.platforms.folder import grade_folder


def runner_result(run: GradingRun) -> dict:
    """The grading reporter's runner result: status, max_score, and one test per part with its score."""
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
    for part in run.parts():
        failure = part.first_failure
        message = (
            ""
            if failure is None
            else (failure.message if failure.visibility == "visible" else "details are shown after the due date")
        )
        tests.append(
            {
                "name": part.title,
                "status": "pass" if failure is None else "fail",
                "score": part.score,
                "message": message,
                "line_no": 0,
                "execution_time": "",
            }
        )
    status = "pass" if all(t["status"] == "pass" for t in tests) else "fail"
    return {"version": 1, "status": status, "max_score": run.max_score, "tests": tests}


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
    print(f"{run.score:g} / {run.max_score:g}" if run.graded else f"cannot grade: {run.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
