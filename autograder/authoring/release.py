"""Generate the student release of the `mha` assignment from reference/mha.py.

The steps, each a small function:

1. read reference/mha.py (jupytext percent format, the single source of the solution code);
2. give every cell nbgrader metadata: cells with a solution region become answer cells, cells
   tagged "autograder-test" become locked grade cells whose grade_id is their part and whose
   points come from the rubric, and every other cell is locked read-only;
3. write the nbgrader source notebook, assignments/source/mha/mha.ipynb;
4. run `nbgrader generate_assignment mha` against a throwaway gradebook, which replaces each
   solution region with a stub and adds checksums: assignments/release/mha/mha.ipynb;
5. write assignments/release/mha/mha.py, the same cells as a jupytext percent file.

Everything written is deterministic (cell ids derived from the cells, sorted JSON keys, no
timestamps), so running it twice gives byte-identical files and a stale release is easy to spot.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TypedDict

import jupytext
import nbformat

from autograder.contract import ASSIGNMENT, PART_IDS
from autograder.rubric import Rubric, load_rubric

SOLUTION_BEGIN = "### BEGIN SOLUTION"
SOLUTION_END = "### END SOLUTION"
TEST_TAG = "autograder-test"
NBGRADER_SCHEMA_VERSION = 3
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


class ReleaseError(RuntimeError):
    """The reference cannot be released as it is; the message names the cell and what to fix."""


def default_root() -> Path:
    return Path(__file__).resolve().parents[2]


# -- 1 and 2: the source notebook ------------------------------------------------------------


def is_solution_cell(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and SOLUTION_BEGIN in cell.source


def test_cell_part(cell: nbformat.NotebookNode) -> str | None:
    """The part id of an autograder-test cell (`# %% tags=["autograder-test"] part="..."`), else None."""
    if TEST_TAG not in cell.metadata.get("tags", []):
        return None
    part: str | None = cell.metadata.get("part")
    return part


def defined_name(source: str) -> str | None:
    """The first name a code cell defines (class, function or constant), for a readable grade_id."""
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return node.name
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            return node.targets[0].id
    return None


def nbgrader_metadata(grade_id: str, *, solution: bool, grade: bool, points: float | None = None) -> dict[str, object]:
    meta: dict[str, object] = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": not solution,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": solution,
    }
    if grade:
        if points is None:
            raise ValueError(f"the grade cell {grade_id!r} has no points")
        meta["points"] = int(points) if float(points).is_integer() else points
    return meta


def build_source_notebook(reference: Path, rubric: Rubric) -> nbformat.NotebookNode:
    """The nbgrader source notebook: reference cells with nbgrader metadata and stable ids."""
    text = jupytext.read(reference, fmt="py:percent")
    nb: nbformat.NotebookNode = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    seen_parts: dict[str, int] = {}
    used_ids: set[str] = set()
    for index, cell in enumerate(text.cells, start=1):
        where = f"{reference.name}, cell {index} ({cell.source.splitlines()[0] if cell.source else 'empty'!r})"
        part = test_cell_part(cell)
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(cell.source)
        else:
            new = nbformat.v4.new_code_cell(cell.source)
        if part is not None:
            if part not in PART_IDS or part not in rubric.parts:
                raise ReleaseError(f"{where}: part {part!r} is not a part of the rubric ({', '.join(rubric.parts)})")
            if part in seen_parts:
                raise ReleaseError(
                    f"{where}: part {part!r} already has a test cell (cell {seen_parts[part]}); one per part"
                )
            if SOLUTION_BEGIN in cell.source:
                raise ReleaseError(f"{where}: a test cell cannot hold a solution region")
            seen_parts[part] = index
            grade_id = part
            meta = nbgrader_metadata(grade_id, solution=False, grade=True, points=rubric.part_points(part))
        elif is_solution_cell(cell):
            if SOLUTION_END not in cell.source:
                raise ReleaseError(f"{where}: {SOLUTION_BEGIN} without {SOLUTION_END}")
            grade_id = f"answer-{defined_name(cell.source) or index}"
            meta = nbgrader_metadata(grade_id, solution=True, grade=False)
        else:
            if SOLUTION_BEGIN in cell.source or SOLUTION_END in cell.source:
                raise ReleaseError(f"{where}: solution markers belong only in code cells")
            grade_id = f"cell-{index:02d}"
            meta = nbgrader_metadata(grade_id, solution=False, grade=False)
        if grade_id in used_ids:
            raise ReleaseError(f"{where}: grade_id {grade_id!r} is used twice; rename the definition")
        used_ids.add(grade_id)
        new.id = grade_id  # cell ids are random by default; derive them so the output is stable
        new.metadata = {"nbgrader": meta}
        nb.cells.append(new)
    missing = [p for p in rubric.parts if p in PART_IDS and p not in seen_parts and rubric.part_points(p) > 0]
    if missing:
        raise ReleaseError(f"{reference.name}: no autograder-test cell for part(s) {', '.join(missing)}")
    nbformat.validate(nb)
    return nb


def write_notebook(nb: nbformat.NotebookNode, path: Path) -> None:
    """nbformat's JSON (sorted keys, one-space indent) with a final newline: stable bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text: str = nbformat.writes(nb, version=4)
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


# -- 4: nbgrader --------------------------------------------------------------------------------


def run_generate_assignment(course_dir: Path) -> None:
    """`nbgrader generate_assignment` with a throwaway gradebook and no user or system config."""
    bin_dir = str(Path(sys.executable).parent)  # nbgrader runs `alembic` from the same environment
    with tempfile.TemporaryDirectory(prefix="mha-release-") as scratch:
        env = dict(os.environ)
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        env["JUPYTER_CONFIG_DIR"] = str(Path(scratch) / "jupyter")  # ignore ~/.jupyter
        env.pop("JUPYTER_CONFIG_PATH", None)
        command = [
            sys.executable,
            "-m",
            "nbgrader",
            "generate_assignment",
            ASSIGNMENT,
            "--force",
            f"--CourseDirectory.root={course_dir}",
            f"--db=sqlite:///{Path(scratch) / 'gradebook.db'}",
            "--log-level=WARN",
        ]
        done = subprocess.run(command, cwd=course_dir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"nbgrader generate_assignment failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


# -- 5: the .py copy ------------------------------------------------------------------------------


def py_notebook(release_nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The release cells without nbgrader metadata; self-check cells keep a short title."""
    nb: nbformat.NotebookNode = nbformat.v4.new_notebook()
    nb.metadata = {"jupytext": {"notebook_metadata_filter": "-all", "cell_metadata_filter": "title,-all"}}
    for cell in release_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(cell.source)
        else:
            new = nbformat.v4.new_code_cell(cell.source)
        if meta.get("grade") and not meta.get("solution"):
            points = meta["points"]
            new.metadata["title"] = f"Self-check: part {meta['grade_id']}, {points:g} points, do not edit"
        nb.cells.append(new)
    return nb


def write_release_py(release_nb: nbformat.NotebookNode, path: Path) -> None:
    text = jupytext.writes(py_notebook(release_nb), fmt="py:percent")
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


# -- the whole release --------------------------------------------------------------------------


def check_release(nb: nbformat.NotebookNode, where: Path) -> None:
    for index, cell in enumerate(nb.cells, start=1):
        if SOLUTION_BEGIN in cell.source or SOLUTION_END in cell.source:
            raise ReleaseError(f"{where}: cell {index} still holds a solution marker")


class ReleaseSummary(TypedDict):
    """What `release_assignment` wrote: its cells, their points, and the files (relative to the root)."""

    answer_cells: int
    test_cells: int
    points: float
    files: list[str]


def release_assignment(root: Path | None = None) -> ReleaseSummary:
    """Regenerate assignments/{source,release}/mha/ under `root` (default: this checkout)."""
    root = Path(root).resolve() if root else default_root()
    reference = root / "reference" / "mha.py"
    rubric_path = root / "autograder" / "rubric.toml"
    rubric = load_rubric(rubric_path if rubric_path.exists() else None)
    course_dir = root / "assignments"
    source_path = course_dir / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    release_dir = course_dir / "release" / ASSIGNMENT

    source_nb = build_source_notebook(reference, rubric)
    if source_path.parent.exists():
        shutil.rmtree(source_path.parent)  # nbgrader copies every file in here into the release
    write_notebook(source_nb, source_path)

    run_generate_assignment(course_dir)
    release_path = release_dir / f"{ASSIGNMENT}.ipynb"
    release_nb = nbformat.read(release_path, as_version=4)
    check_release(release_nb, release_path)
    write_notebook(release_nb, release_path)  # rewritten so its bytes never depend on nbgrader's writer
    py_path = release_dir / f"{ASSIGNMENT}.py"
    write_release_py(release_nb, py_path)

    tests = [c.metadata["nbgrader"] for c in release_nb.cells if c.metadata["nbgrader"]["grade"]]
    answers = [c for c in release_nb.cells if c.metadata["nbgrader"]["solution"]]
    summary: ReleaseSummary = {
        "answer_cells": len(answers),
        "test_cells": len(tests),
        "points": sum(t["points"] for t in tests),
        "files": [p.relative_to(root).as_posix() for p in (source_path, release_path, py_path)],
    }
    print(
        f"release: {summary['answer_cells']} answer cells, {summary['test_cells']} self-check cells "
        f"({summary['points']:g} points) -> {', '.join(summary['files'][1:])}"
    )
    return summary
