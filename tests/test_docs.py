"""The docs name only what exists: every file path and `make` target in README.md and docs/*.md."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys

import pytest

from helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# What the project writes when it runs (a course's outputs, the kit, the benchmark...), named in the docs
# but not in the repository.
WRITTEN = (
    "dist/*",
    "bench/*",
    "*results.json",
    "*inputs.json",
    "*grades.csv",
    "*grades-canvas.csv",
    "*nbgrader-grades.csv",
    "*gradebook.db",
    "*autograded/*",
    "*feedback/*",
    "*feedback.html",
    "*class.html",
    "*results/*",
    "slurm-logs/*",
    "*.venv*",
    "/autograder/*",  # Gradescope's image
    "*/submission/*",
    "*selfcheck.py",  # in the student kit (autograder/authoring/selfcheck.py here)
    "*requirements.txt",  # in the student kit and Gradescope's zip
    "setup.sh",
    "run_autograder",
    "*again.json",
    "RESULTS.json",  # a placeholder
    "mha-1.ipynb",  # the name an LMS download may give a submission
    "gpu-check/*",  # tools/gpu_check.sh's output
    "grader/*",  # folders of a GitHub Classroom run: the grader's checkout, the student's repository
    "submission/*",
    "my-course/*",  # a course's repository on GitHub
    "*timestamp.txt",  # written beside a submission by nbgrader or an LMS export
)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a file (with an extension), a folder (ending in /), or anything under one of the repository's folders
PATHISH = re.compile(
    r"^[\w.<>*\-/]+\.(py|md|toml|ya?ml|sh|sbatch|json|ipynb|lock|cfg|txt|j2|ini|db|csv|png|html)$"
    r"|^[\w.<>*\-/]+/$"
    r"|^(assignments|autograder|reference|tests|tools|deploy|docs|\.github|\.ci)/[\w.<>*\-/]*$"
)
MAKE = re.compile(r"\bmake ([a-z][\w-]*)")
FENCED = re.compile(r"```.*?```", re.DOTALL)


def tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def named_paths(text: str) -> set[str]:
    found = set()
    for token in CODE.findall(text) + LINK.findall(text):
        token = token.strip().rstrip(".,:;")
        for word in token.split():
            if "://" in word or word.startswith(("-", "$")) or "=" in word:
                continue
            word = word.strip("'\"()")
            if PATHISH.match(word) and not word.startswith(("python", "torch")):
                found.add(word)
    return found


def exists(path: str, files: list[str], doc) -> bool:
    if any(fnmatch.fnmatch(path, pattern) for pattern in WRITTEN):
        return True
    pattern = re.sub(r"<[^>]+>|\bK\b|\.\.\.", "*", path).rstrip("/")
    if (ROOT / pattern).exists() or (doc.parent / pattern).exists():
        return True
    folders = {f.rsplit("/", i)[0] for f in files for i in range(1, f.count("/") + 1)}
    # a path named within its folder (`sandbox/client.py` in the architecture, `checks/test_<part>.py`)
    return any(fnmatch.fnmatch(f, pattern) or fnmatch.fnmatch(f, f"*/{pattern}") for f in [*files, *folders])


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.MULTILINE))


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_path_named_exists(doc):
    files = tracked()
    missing = sorted(p for p in named_paths(doc.read_text()) if not exists(p, files, doc))
    assert missing == [], f"{doc.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_every_make_target_named_exists(doc):
    targets = make_targets()
    text = doc.read_text()
    code = " ".join(CODE.findall(FENCED.sub("", text)) + FENCED.findall(text))  # commands, not prose
    missing = sorted(set(MAKE.findall(code)) - targets)
    assert missing == [], f"{doc.name} names make targets that do not exist: {missing}"


def test_the_check_finds_what_is_gone():
    files = tracked()
    assert not exists("autograder/worker_main.py", files, DOCS[0])
    assert not exists("autograder/checks/mistakes.py", files, DOCS[0])
    assert exists("autograder/grading/checks/mistakes.py", files, DOCS[0])
    assert exists("checks/test_<part>.py", files, DOCS[0]) and exists("sandbox/client.py", files, DOCS[0])
    assert "worker_main.py" not in make_targets() and {"grade", "explain", "release"} <= make_targets()


# -- what proves each place: the tables of docs/clusters.md ------------------------------------------------

CLUSTERS = ROOT / "docs" / "clusters.md"
INSTRUCTORS = ROOT / "docs" / "instructors.md"
PROVED = (CLUSTERS, INSTRUCTORS)  # the docs whose tables say, row by row, which test proves it
PROOF_COLUMNS = ("proved by", "followed by")
TEST_ID = re.compile(r"`(tests/test_\w+\.py)(?:::(\w+)(\[[^`]*\])?)?`")
NO_TEST = "no test here"


def proof_cells(text: str) -> list[tuple[str, str]]:
    """(the row's first cell, its proof cell) for every row of every table with a proof column."""
    cells, column = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if column is None:
            column = next((i for i, cell in enumerate(row) if cell in PROOF_COLUMNS), -1)
        elif column >= 0 and not set(line) <= set("|- "):
            cells.append((row[0], row[column] if column < len(row) else ""))
    return cells


def unproved(text: str, collected: set[str]) -> list[str]:
    """The rows whose proof cell names no test, or a test that does not exist (`collected`: pytest's ids)."""
    wrong = []
    for row, cell in proof_cells(text):
        named = TEST_ID.findall(cell)
        if not named and not cell.startswith(NO_TEST):
            wrong.append(f"{row}: names no test")
        for path, function, param in named:
            wanted = f"{path}::{function}{param}" if function else path
            if not any(
                test == wanted or test.startswith(f"{wanted}[") or test.startswith(f"{wanted}::") for test in collected
            ):
                wrong.append(f"{row}: {wanted} does not exist")
    return wrong


@pytest.fixture(scope="module")
def collected_tests() -> set[str]:
    cells = [cell for doc in PROVED for _, cell in proof_cells(doc.read_text())]
    files = sorted({path for cell in cells for path, _, _ in TEST_ID.findall(cell)})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    tests = {line for line in done.stdout.splitlines() if line.startswith("tests/")}
    assert tests, done.stdout[-2000:] + done.stderr[-2000:]
    return tests


@pytest.mark.slow
def test_every_place_in_clusters_md_names_the_test_that_proves_it(collected_tests):
    text = CLUSTERS.read_text()
    assert len(proof_cells(text)) >= 20  # the tables of places, pod options, bubblewraps and advice
    assert unproved(text, collected_tests) == []


@pytest.mark.slow
def test_every_row_of_running_in_a_container_in_instructors_md_names_the_test_that_proves_it(collected_tests):
    """docs/instructors.md, "In a container": as root and not, what the grader does itself and what is left to
    the user, each row with the tests that show it (the real containers among them)."""
    text = INSTRUCTORS.read_text()
    rows = proof_cells(text)
    assert len(rows) >= 5 and sum("tests/test_containers.py::" in cell for _, cell in rows) >= 4, rows
    assert unproved(text, collected_tests) == []


@pytest.mark.slow
def test_the_proof_check_finds_a_row_without_a_test_and_a_test_that_is_gone(collected_tests):
    table = (
        "| where | proved by |\n| --- | --- |\n"
        "| a | the machine itself |\n"
        "| b | `tests/test_doctor.py::test_no_such_test` |\n"
        "| c | `tests/test_doctor.py::test_the_advice_names_the_one_change_and_its_command[no-such-id]` |\n"
        "| d | `tests/test_doctor.py::test_the_advice_names_the_one_change_and_its_command[docker-user]` |\n"
        "| e | no test here (no such runner) |\n"
    )
    assert unproved(table, collected_tests) == [
        "a: names no test",
        "b: tests/test_doctor.py::test_no_such_test does not exist",
        "c: tests/test_doctor.py::test_the_advice_names_the_one_change_and_its_command[no-such-id] does not exist",
    ]
