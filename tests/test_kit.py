"""The student kit: everything students receive, no line of the solution; its self-check is theirs."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from autograder.authoring import kit
from autograder.rubric import load_rubric
from classkit import ROOT
from helpers import REFERENCE, mutated_reference

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def reference_solution_lines() -> set[str]:
    """Every line written between the solution markers of reference/mha.py that is not also a line of
    the code students are given (the test's own reading, independent of the kit builder's)."""
    inside, solution, given = False, set(), set()
    for line in REFERENCE.read_text().splitlines():
        if BEGIN in line or END in line:
            inside = BEGIN in line
            continue
        (solution if inside else given).add(line.strip())
    return {line for line in solution - given if line}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "student-kit", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_kit_holds_the_release_a_self_check_and_a_readme(built):
    with zipfile.ZipFile(built / "mha-student-kit.zip") as bundle:
        names = sorted(bundle.namelist())
        assert names == [
            f"mha-student-kit/{n}" for n in ("Makefile", "README.md", "mha.ipynb", "mha.py", "selfcheck.py")
        ]
        for name in ("mha.ipynb", "mha.py"):
            release = (ROOT / "assignments" / "release" / "mha" / name).read_bytes()
            assert bundle.read(f"mha-student-kit/{name}") == release
        readme = bundle.read("mha-student-kit/README.md").decode()
    assert "python selfcheck.py mha.ipynb" in readme and "Submit" in readme
    limits = load_rubric().limit  # the time limits a student's code is held to are stated before submission
    assert f"each top-level cell may run {limits('cell_seconds'):g} s" in readme
    assert f"the later ones {limits('later_cell_seconds'):g} s each" in readme
    assert f"may run {limits('request_seconds'):g} s, and\n{limits('hung_request_seconds'):g} s once" in readme


def test_no_solution_line_is_anywhere_in_the_kit(built):
    secret = reference_solution_lines()
    assert len(secret) > 40 and "return torch.cat(outputs, dim=-1)" in secret
    leaks = []
    with zipfile.ZipFile(built / "mha-student-kit.zip") as bundle:
        for name in bundle.namelist():
            text = bundle.read(name).decode("utf-8")
            lines = {line.strip() for line in text.splitlines()}
            if name.endswith(".ipynb"):  # the cells' sources, as Jupyter shows them
                for cell in json.loads(text)["cells"]:
                    lines |= {line.strip() for line in "".join(cell["source"]).splitlines()}
            leaks += [f"{name}: {line}" for line in sorted(lines & secret)]
    assert leaks == []
    folder_files = [p for p in (built / "mha-student-kit").iterdir()]
    assert all(not ({line.strip() for line in p.read_text().splitlines()} & secret) for p in folder_files)


def test_a_kit_that_would_hold_a_solution_line_is_refused(tmp_path, monkeypatch):
    leaky = dict(kit.kit_files(ROOT))
    leaky["mha.py"] += b"\n        return torch.cat(outputs, dim=-1)\n"
    monkeypatch.setattr(kit, "kit_files", lambda root: leaky)
    with pytest.raises(kit.KitError, match="return torch.cat"):
        kit.build_kit(tmp_path)
    assert not (tmp_path / "mha-student-kit.zip").exists()


def selfcheck(path, cwd):
    return subprocess.run(
        [sys.executable, "selfcheck.py", str(path)], capture_output=True, text=True, timeout=600, cwd=cwd
    )


@pytest.mark.slow
def test_the_kits_self_check_reports_each_part_without_the_answer_key(built, tmp_path):
    folder = built / "mha-student-kit"
    parts = len(load_rubric().parts)  # one self-check cell per part
    untouched = selfcheck(folder / "mha.ipynb", folder)
    assert untouched.returncode == 1
    assert f"0 of {parts} self-checks passed" in untouched.stdout and untouched.stdout.count("not done yet") == parts
    solved = selfcheck(REFERENCE, folder)  # the reference carries the same self-check cells
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert f"{parts} of {parts} self-checks passed" in solved.stdout
    wrong = mutated_reference(tmp_path, "dim1", "return torch.cat(outputs, dim=-1)", "return torch.cat(outputs, dim=1)")
    failed = selfcheck(wrong, folder)
    assert failed.returncode == 1
    assert "combine  failed: combine returned shape (2, 12, 2)" in failed.stdout
    assert "the heads were joined along the token dimension" in failed.stdout
    # `make check` in this repository runs the same self-check: no reference/ needed
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "check", f"SUBMISSION={wrong}", f"VENV={sys.prefix}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0 and "combine  failed" in done.stdout
