"""Gradescope: the autograder zip (`make gradescope`), and what its `run_autograder` runs.

The zip holds `setup.sh` and `run_autograder` (deploy/gradescope/, as shipped), `requirements.txt`
and `requirements.lock`, and the grader (`autograder/`, `reference/`, `pyproject.toml`), all at its top
level: Gradescope unpacks it in `/autograder/source/` and copies `run_autograder` to `/autograder/`.
It runs `setup.sh` once, as root, when it builds the image: it installs bubblewrap (the sandbox),
makes a virtualenv with torch and exactly the locked dependencies, and closes the grader's source to
other users. For each submission it runs `run_autograder`, which runs
`python -m autograder.platforms.gradescope run`:

1. write a placeholder `/autograder/results/results.json` ("grading did not finish"), so a grader
   killed for memory or time leaves one;
2. find the submission in `/autograder/submission/` (the same rule as `make grade`: `mha.ipynb` or
   `mha.py`, else the one .ipynb/.py file, else the best of several, said in the output), never
   through a link out of that folder, and copy it out of the student's reach;
3. grade it exactly as `python -m autograder grade` does: the trusted grader in this process, the
   student's code in a fresh worker, in the bubblewrap sandbox where the container allows it, else
   as a separate process; either way, under a root grader, as a fresh unprivileged uid (the
   sandbox's `launcher`), which cannot read the grader's source;
4. write `/autograder/results/results.json` (Gradescope's format, always, also when nothing could be
   graded).

Steps 1 to 4 are `platforms.folder.grade_folder`, which GitHub Classroom's adapter runs as well.

Every path comes from `--root` (default `$AUTOGRADER_ROOT`, else `/autograder`), so the same script
runs against a fake tree in a test.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from autograder.atomic import write_zip_atomically
from autograder.authoring.release import default_root
from autograder.contract import ASSIGNMENT
from autograder.platforms.folder import grade_folder

ZIP_NAME = f"{ASSIGNMENT}-gradescope.zip"

RECIPE = Path("deploy") / "gradescope"  # setup.sh and run_autograder, as shipped


def source_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml", root / "requirements.lock"]
    for package in ("autograder", "reference"):
        files += [p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files)


def grader_requirements(root: Path) -> str:
    """The grader's own dependencies (pyproject.toml's, markers kept), one a line: what setup.sh installs,
    each at the version requirements.lock pins. torch comes first, chosen by TORCH_SPEC."""
    from autograder.rubric import tomllib

    dependencies = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    return "".join(f"{requirement}\n" for requirement in dependencies)


def build_zip(out: Path, root: Path | None = None) -> Path:
    """The zip Gradescope unpacks in /autograder/source: its two scripts (copied from there), the grader's
    requirements and the grader itself, at the top level."""
    root = Path(root) if root else default_root()
    archive = Path(out) / ZIP_NAME
    write_zip_atomically(
        archive,
        [(name, (root / RECIPE / name).read_bytes(), 0o755) for name in ("setup.sh", "run_autograder")]
        + [("requirements.txt", grader_requirements(root), 0o644)]
        + [(path.relative_to(root).as_posix(), path.read_bytes(), 0o644) for path in source_files(root)],
    )
    print(f"Gradescope autograder: {archive} (setup.sh, run_autograder, requirements, the grader)")
    return archive


def run(root: Path) -> int:
    """Grade ROOT/submission/ into ROOT/results/results.json (`folder.grade_folder`); exit 0 whenever
    results.json was written, as Gradescope expects."""
    grade_folder(
        root / "submission", root / "results" / "results.json", device=os.environ.get("AUTOGRADER_DEVICE", "auto")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autograder.platforms.gradescope", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run", help="grade ROOT/submission/ into ROOT/results/results.json")
    runner.add_argument("--root", type=Path, default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
    build = sub.add_parser("build", help="write the autograder zip")
    build.add_argument("--out", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    if args.command == "build":
        build_zip(args.out)
        return 0
    return run(args.root)


if __name__ == "__main__":
    from autograder.ending import end

    end(main)
