"""The docs name only what exists: every file path and `make` target in README.md and docs/*.md."""

from __future__ import annotations

import fnmatch
import re
import subprocess

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
