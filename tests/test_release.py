"""The student release: up to date with reference/mha.py, complete, and free of solutions."""

import ast
import difflib
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.release import (
    ReleaseError,
    build_source_notebook,
    default_root,
    release_assignment,
)
from autograder.rubric import PART_IDS, load_rubric

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("assignments/source/mha/mha.ipynb")
RELEASE_NB = Path("assignments/release/mha/mha.ipynb")
RELEASE_PY = Path("assignments/release/mha/mha.py")
GENERATED = (SOURCE, RELEASE_NB, RELEASE_PY)
# What release_assignment reads; everything it writes is compared with the committed files.
INPUTS = ("reference/mha.py", "autograder/rubric.toml", "assignments/nbgrader_config.py")

# The student contract: what a submission defines, as the notebook's first cells state it.
STUB_FUNCTIONS = ("combine", "make_2d_wrapper", "head_column_ranges", "split_columns", "fuse_heads")
STUB_METHODS = {"MultiHeadAttentionWrapper": "forward", "MultiHeadAttention": "forward"}
GIVEN_METHODS = {
    "CausalAttention": ("__init__", "forward"),
    "MultiHeadAttentionWrapper": ("__init__",),
    "MultiHeadAttention": ("__init__",),
}
CONSTANTS = ("HEADS_RUN", "EIGHT_COLUMNS_FOUR_HEADS", "OUTPUT_SHAPE_STEP")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """A release generated into a copy of the project's inputs, started from an unrelated cwd."""
    root = tmp_path_factory.mktemp("project")
    for name in INPUTS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    elsewhere = tmp_path_factory.mktemp("cwd")
    cwd = os.getcwd()
    os.chdir(elsewhere)
    try:
        summary = release_assignment(root)
    finally:
        os.chdir(cwd)
    return root, summary


def read_nb(path):
    return nbformat.read(ROOT / path, as_version=4)


def code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def nbgrader(cell):
    return cell.metadata.get("nbgrader", {})


def is_test_cell(cell):
    return nbgrader(cell).get("grade") is True and not nbgrader(cell).get("solution")


# -- up to date ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", GENERATED, ids=[p.name if p != SOURCE else "source" for p in GENERATED])
def test_committed_release_is_what_make_release_generates(regenerated, path):
    root, _ = regenerated
    fresh, committed = (root / path).read_bytes(), (ROOT / path).read_bytes()
    if fresh != committed:
        diff = difflib.unified_diff(
            committed.decode().splitlines(),
            fresh.decode().splitlines(),
            f"committed {path}",
            f"generated {path}",
            n=1,
            lineterm="",
        )
        pytest.fail(f"{path} is stale: run `make release` and commit the result.\n" + "\n".join(list(diff)[:40]))


@pytest.mark.slow
def test_release_writes_only_the_generated_files(regenerated):
    root, summary = regenerated
    written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert written == sorted([*INPUTS, *(p.as_posix() for p in GENERATED)])  # no gradebook, no log
    assert summary["points"] == load_rubric().max_score  # every part, speed included, has its test cell


def test_default_root_is_this_checkout():
    assert default_root() == ROOT


# -- the contract -------------------------------------------------------------------------------


def raises_not_implemented(body):
    return any(
        isinstance(node, ast.Raise)
        and isinstance(node.exc, (ast.Call, ast.Name))
        and "NotImplementedError" in ast.unparse(node.exc)
        for node in body
    )


def test_release_py_holds_the_contract():
    tree = ast.parse((ROOT / RELEASE_PY).read_text())
    reference = ast.parse((ROOT / "reference/mha.py").read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    ref_defs = {n.name: n for n in reference.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}

    for name in STUB_FUNCTIONS:
        assert name in defs, f"the release has no function {name}"
        assert ast.dump(defs[name].args) == ast.dump(ref_defs[name].args), (
            f"{name}'s signature differs from the reference"
        )
        assert raises_not_implemented(defs[name].body), f"{name} is not a stub raising NotImplementedError"

    for cls in GIVEN_METHODS:
        assert cls in defs, f"the release has no class {cls}"
        methods = {n.name: n for n in defs[cls].body if isinstance(n, ast.FunctionDef)}
        ref_methods = {n.name: n for n in ref_defs[cls].body if isinstance(n, ast.FunctionDef)}
        for method in GIVEN_METHODS[cls]:
            assert ast.dump(methods[method]) == ast.dump(ref_methods[method]), (
                f"{cls}.{method} must be given as in the reference"
            )
        if cls in STUB_METHODS:
            stub = methods[STUB_METHODS[cls]]
            assert ast.dump(stub.args) == ast.dump(ref_methods[stub.name].args)
            assert raises_not_implemented(stub.body), f"{cls}.{stub.name} is not a stub raising NotImplementedError"

    assigned = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    for name in CONSTANTS:
        assert name in assigned, f"the release does not define {name}"
        assert all(isinstance(v, ast.Constant) and v.value is None for v in assigned[name]), (
            f"{name} must be None in the release"
        )


def test_release_code_imports_only_torch_and_the_standard_library():
    # Students run the notebook without this project's packages.
    for path in (RELEASE_PY, SOURCE):
        nb = read_nb(path) if path.suffix == ".ipynb" else None
        sources = [c.source for c in code_cells(nb)] if nb else [(ROOT / path).read_text()]
        for source in sources:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                    top = {n.split(".")[0] for n in names}
                    assert top <= {"torch"} | sys.stdlib_module_names, f"{path} imports {names}"


def test_release_py_has_the_notebooks_cells():
    """The grader splits a .py submission on `# %%` lines and runs each code cell by itself."""
    chunks = re.split(r"^# %%.*\n", (ROOT / RELEASE_PY).read_text(), flags=re.M)
    headers = re.findall(r"^# %%.*$", (ROOT / RELEASE_PY).read_text(), flags=re.M)
    py_code = [chunk.strip() for header, chunk in zip(headers, chunks[1:], strict=True) if "[markdown]" not in header]
    nb = read_nb(RELEASE_NB)
    assert py_code == [cell.source.strip() for cell in code_cells(nb)]
    titles = [h for h in headers if "Self-check" in h]
    expected = [
        f"# %% Self-check: part {nbgrader(c)['grade_id']}, {nbgrader(c)['points']:g} points, do not edit"
        for c in code_cells(nb)
        if is_test_cell(c)
    ]
    assert titles == expected
    assert "nbgrader" not in "\n".join(headers)


# -- nbgrader metadata ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", (SOURCE, RELEASE_NB), ids=["source", "release"])
def test_every_cell_has_nbgrader_metadata(path):
    nb = read_nb(path)
    rubric = load_rubric()
    grade_ids = [nbgrader(cell).get("grade_id") for cell in nb.cells]
    assert all(grade_ids) and len(set(grade_ids)) == len(grade_ids), "every cell needs a unique grade_id"
    assert [cell.id for cell in nb.cells] == grade_ids, "cell ids are derived from grade_ids, so they are stable"
    tests = [cell for cell in nb.cells if is_test_cell(cell)]
    assert [nbgrader(c)["grade_id"] for c in tests] == [
        "combine",
        "wrapper",
        "two_dim",
        "quiz",
        "columns",
        "mha",
        "speed",
        "fuse",
    ]
    for cell in tests:
        meta = nbgrader(cell)
        assert meta["grade_id"] in PART_IDS
        assert meta["locked"] is True
        assert meta["points"] == rubric.part_points(meta["grade_id"])
    for cell in nb.cells:
        meta = nbgrader(cell)
        if meta["solution"]:
            assert cell.cell_type == "code" and not meta["locked"] and not meta["grade"]
        elif not meta["grade"]:
            assert meta["locked"], f"cell {cell.id} should be locked read-only"


def test_solution_cells_are_the_cells_with_solution_regions():
    source, release = read_nb(SOURCE), read_nb(RELEASE_NB)
    assert [c.id for c in source.cells] == [c.id for c in release.cells]
    for before, after in zip(source.cells, release.cells, strict=True):
        has_solution = "### BEGIN SOLUTION" in before.source
        assert nbgrader(before).get("solution") is has_solution, f"source cell {before.id}"
        assert nbgrader(after).get("solution") is has_solution, f"release cell {after.id}"
        if has_solution:
            assert "raise NotImplementedError()" in after.source
        else:
            assert after.source == before.source, f"cell {before.id} changed in the release"


def test_points_come_from_the_rubric(tmp_path):
    rubric_file = tmp_path / "rubric.toml"
    text = (ROOT / "autograder/rubric.toml").read_text()
    rubric_file.write_text(re.sub(r"(\[parts\.mha\][^\[]*?points = )\d+", r"\g<1>7", text, count=1))
    rubric = load_rubric(rubric_file)
    assert rubric.part_points("mha") == 7
    nb = build_source_notebook(ROOT / "reference/mha.py", rubric)
    points = {nbgrader(c)["grade_id"]: nbgrader(c)["points"] for c in nb.cells if is_test_cell(c)}
    assert points["mha"] == 7
    assert points["combine"] == rubric.part_points("combine")


@pytest.mark.parametrize(
    "header, message",
    [
        ('# %% tags=["autograder-test"] part="nonsense"', "is not a part of the rubric"),
        ('# %% tags=["autograder-test"] part="combine"', "already has a test cell"),
    ],
)
def test_bad_test_cells_are_refused(tmp_path, header, message):
    text = (ROOT / "reference/mha.py").read_text() + f"\n\n{header}\nassert True\n"
    reference = tmp_path / "mha.py"
    reference.write_text(text)
    with pytest.raises(ReleaseError, match=message):
        build_source_notebook(reference, load_rubric())


# -- no solutions in the release ----------------------------------------------------------------------


def solution_lines():
    """Lines of the reference that occur only inside solution regions."""
    inside, outside, in_region = set(), set(), False
    for line in (ROOT / "reference/mha.py").read_text().splitlines():
        stripped = line.strip()
        if stripped == "### BEGIN SOLUTION":
            in_region = True
        elif stripped == "### END SOLUTION":
            in_region = False
        elif stripped:
            (inside if in_region else outside).add(stripped)
    return inside - outside


def test_solution_lines_are_found():
    lines = solution_lines()
    assert 'HEADS_RUN = "B"' in lines and "return torch.cat(outputs, dim=-1)" in lines


@pytest.mark.parametrize("path", (RELEASE_NB, RELEASE_PY), ids=["ipynb", "py"])
def test_no_solution_leaks_into_the_release(path):
    text = (ROOT / path).read_text()
    if path.suffix == ".ipynb":
        text = "\n".join(cell.source for cell in read_nb(path).cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    lines = {line.strip() for line in text.splitlines()}
    leaked = sorted(lines & solution_lines())
    assert not leaked, f"solution code in {path}: {leaked}"


# -- the sample class: the release plus each student's answers --------------------------------------------------


def test_the_sample_class_is_the_release_plus_each_students_answers():
    """`make release` rewrites assignments/submitted/ from assignments/samples/; a stale sample fails here."""
    from autograder.authoring.samples import expected_samples, stale_samples

    assert stale_samples() == [], "a sample is not the current release plus its answers: run `make release`"
    texts = {path.parent.parent.name: text for path, text in expected_samples().items()}
    assert set(texts) == {"ada", "brook", "casey", "devon", "emery"}
    release = (ROOT / RELEASE_PY).read_text()
    assert texts["devon"] == release  # the untouched release
    ada = nbformat.reads(texts["ada"], as_version=4)
    assert not any("raise NotImplementedError()" in c.source for c in ada.cells if c.cell_type == "code")  # complete
    assert "for h in range(self.num_heads):  # one head at a time" in texts["brook"]
    assert "return torch.cat(outputs, dim=1)" in texts["casey"] and 'HEADS_RUN = "A"' in texts["casey"]
    assert "while True:  # forgot to stop" in texts["emery"]
    for name in ("brook", "casey", "emery"):  # everything else as released
        stubs = [line for line in texts[name].splitlines() if line.strip() == "raise NotImplementedError()"]
        assert stubs == [], name


def test_a_stale_sample_is_found(tmp_path):
    from autograder.authoring.samples import SampleError, stale_samples, write_samples

    for name in ("assignments/samples", "assignments/release", "assignments/source", "assignments/submitted"):
        shutil.copytree(ROOT / name, tmp_path / name)
    assert stale_samples(tmp_path) == []
    casey = tmp_path / "assignments/submitted/casey/mha/mha.py"
    casey.write_text(casey.read_text().replace("dim=1", "dim=-1"))
    assert stale_samples(tmp_path) == ["casey"]
    write_samples(tmp_path)
    assert stale_samples(tmp_path) == []
    (tmp_path / "assignments/samples/casey.toml").write_text('file = "mha.py"\n[answers]\n"answer-nope" = "x = 1"\n')
    with pytest.raises(SampleError, match="no answer cell answer-nope"):
        stale_samples(tmp_path)
