"""Gradescope: the autograder zip (`make gradescope`), and what its `run_autograder` runs.

The zip holds `setup.sh`, `run_autograder` and `source/` (the grader: `autograder/`, `reference/`,
`pyproject.toml`). Gradescope runs `setup.sh` once, as root, when it builds the image: it installs bubblewrap (the
sandbox), makes a virtualenv with torch and the grader's dependencies, and closes the grader's source
to other users. For each submission it runs `run_autograder`, which runs
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
import sys
from pathlib import Path

from autograder.atomic import write_zip_atomically
from autograder.authoring.release import default_root
from autograder.contract import ASSIGNMENT
from autograder.platforms.folder import grade_folder

ZIP_NAME = f"{ASSIGNMENT}-gradescope.zip"

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
apt-get update
apt-get install -y python3 python3-venv python3-pip bubblewrap
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/pip" install --upgrade pip
"$ROOT/venv/bin/pip" install $TORCH_SPEC
# The grader's dependencies only: run_autograder runs the grader from source/.
"$ROOT/venv/bin/python" - "$ROOT/source/pyproject.toml" > "$ROOT/requirements.txt" <<'EOF'
import sys, tomllib
print("\\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
"$ROOT/venv/bin/pip" install -r "$ROOT/requirements.txt"
# The student's code runs as a fresh unprivileged uid, never as root: it cannot read the grader's source.
chmod -R go-rwx "$ROOT/source"
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade /autograder/submission/ into
# /autograder/results/results.json. AUTOGRADER_ROOT and AUTOGRADER_PYTHON override the paths.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}"
cd "$ROOT/source"
export PYTHONPATH="$ROOT/source" PYTHONDONTWRITEBYTECODE=1
exec "$PYTHON" -m autograder.platforms.gradescope run --root "$ROOT"
"""


def source_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml"]
    for package in ("autograder", "reference"):
        files += [p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files)


def build_zip(out: Path, root: Path | None = None) -> Path:
    root = Path(root) if root else default_root()
    archive = Path(out) / ZIP_NAME
    write_zip_atomically(
        archive,
        [("setup.sh", SETUP, 0o755), ("run_autograder", RUN, 0o755)]
        + [(f"source/{path.relative_to(root).as_posix()}", path.read_bytes(), 0o644) for path in source_files(root)],
    )
    print(f"Gradescope autograder: {archive} (setup.sh, run_autograder, source/)")
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
    sys.exit(main())
