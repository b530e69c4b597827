"""The release notebook runs: completely with the reference solutions, and up to the stubs without them."""

import ast
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "assignments/source/mha/mha.ipynb"
RELEASE = ROOT / "assignments/release/mha/mha.ipynb"
# Every name a student writes or completes: a cell that uses one may stop at a stub.
STUB_NAMES = {
    "combine",
    "make_2d_wrapper",
    "head_column_ranges",
    "split_columns",
    "fuse_heads",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "HEADS_RUN",
    "EIGHT_COLUMNS_FOUR_HEADS",
    "OUTPUT_SHAPE_STEP",
}

pytestmark = pytest.mark.slow


def execute(nb, tmp_path):
    """Run every cell in a fresh kernel in an empty folder, keeping errors in the outputs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # students have no project packages
    client = NotebookClient(
        nb, timeout=60, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=env)
    return nb


def errors(cell):
    return [out for out in cell.get("outputs", []) if out.output_type == "error"]


def describe(cell):
    return "; ".join(f"{error.ename}: {error.evalue}" for error in errors(cell))


def is_solution(cell):
    return cell.metadata.get("nbgrader", {}).get("solution", False)


def is_test(cell):
    meta = cell.metadata.get("nbgrader", {})
    return meta.get("grade", False) and not meta.get("solution", False)


def filled_release():
    """The release notebook with the reference solutions put back into the stubs' cells."""
    source = {cell.id: cell for cell in nbformat.read(SOURCE, as_version=4).cells}
    nb = nbformat.read(RELEASE, as_version=4)
    for cell in nb.cells:
        if is_solution(cell):
            cell.source = source[cell.id].source
    return nb


def test_release_with_the_reference_solutions_runs_without_errors(tmp_path):
    nb = filled_release()
    execute(nb, tmp_path)
    failed = {cell.id: describe(cell) for cell in nb.cells if errors(cell)}
    assert not failed, f"cells raised errors with the reference solutions: {failed}"
    for cell in nb.cells:
        if is_test(cell):
            result = "".join(out.get("data", {}).get("text/plain", "") for out in cell.outputs)
            # a self-check's verdict is the value its cell shows; the quiz's answers only the grader judges
            verdict = "'answered: " if cell.metadata["nbgrader"]["grade_id"] == "quiz" else "'passed: "
            assert result.startswith(verdict), f"self-check {cell.id} printed {result!r}"


def test_untouched_release_stops_only_at_the_stubs(tmp_path):
    nb = execute(nbformat.read(RELEASE, as_version=4), tmp_path)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    first_error = next(i for i, cell in enumerate(code) if errors(cell))
    first_solution = next(i for i, cell in enumerate(code) if is_solution(cell))
    assert first_error >= first_solution, (
        f"cell {code[first_error].id} fails before any stub: {describe(code[first_error])}"
    )
    for cell in code:
        for error in errors(cell):
            assert error.ename == "NotImplementedError", (
                f"cell {cell.id} raised {error.ename}: {error.evalue}; only the stubs may fail in the release"
            )
        if errors(cell) and not is_solution(cell):
            used = {node.id for node in ast.walk(ast.parse(cell.source)) if isinstance(node, ast.Name)}
            assert used & STUB_NAMES, f"cell {cell.id} fails without using anything the student writes"
    unanswered = [cell.id for cell in code if is_test(cell) and not errors(cell)]
    assert not unanswered, f"self-checks that pass on the untouched release give free points: {unanswered}"


def test_release_with_the_reference_solutions_gets_full_marks(tmp_path):
    from helpers import grade

    path = tmp_path / "mha.ipynb"
    nbformat.write(filled_release(), path)
    results, run = grade(path, tmp_path)
    assert run.returncode == 0, run.stderr
    assert results["score"] == results["max_score"] == 100, [
        t["name"] for t in results["tests"] if t["status"] != "passed"
    ]
