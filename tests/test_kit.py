"""The student kit: everything students receive, no line of the solution; its self-check is theirs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.authoring import kit, samples
from autograder.rubric import load_rubric
from classkit import ROOT
from helpers import REFERENCE, autograder, grade

PARTS = tuple(load_rubric().parts)

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
    done = autograder("student-kit", "--out", out, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def test_the_kit_holds_the_release_a_self_check_and_a_readme(built):
    with zipfile.ZipFile(built / "mha-student-kit.zip") as bundle:
        names = sorted(bundle.namelist())
        assert names == [
            f"mha-student-kit/{n}"
            for n in ("Makefile", "README.md", "mha.ipynb", "mha.py", "requirements.txt", "selfcheck.py")
        ]
        for name in ("mha.ipynb", "mha.py"):
            release = (ROOT / "assignments" / "release" / "mha" / name).read_bytes()
            assert bundle.read(f"mha-student-kit/{name}") == release
        readme = bundle.read("mha-student-kit/README.md").decode()
        requirements = bundle.read("mha-student-kit/requirements.txt").decode()
    assert "python selfcheck.py mha.py" in readme and "Submit" in readme
    assert "python3 -m venv .venv" in readme and "pip install -r requirements.txt" in readme
    limits = load_rubric().limits  # the time limits a student's code is held to are stated before submission
    assert f"each top-level cell may run {limits.cell_seconds:g} s" in readme
    assert f"the later ones {limits.later_cell_seconds:g} s each" in readme
    assert f"may run {limits.request_seconds:g} s, and\n{limits.hung_request_seconds:g} s once" in readme
    # the grader's own versions, read from the Makefile's TORCH_SPEC and requirements.lock, never typed here
    spec = next(
        line.split("?=")[1].strip()
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("TORCH_SPEC")
    )
    numpy = [
        line.strip() for line in (ROOT / "requirements.lock").read_text().splitlines() if line.startswith("numpy==")
    ]
    pins = [line for line in requirements.splitlines() if line and not line.startswith("#")]
    assert pins == [spec.split()[0].split("+")[0], *numpy]
    # every supported Python gets the grader's numpy (one pin per range of Pythons, each with its marker) ...
    assert len(numpy) >= 2 and all(";" in pin for pin in numpy)
    # ... and the README shows plain versions, not the lock's markers
    assert "python_full_version" not in readme and "==" not in readme
    assert f"torch {pins[0].split('==')[1]}" in readme
    for pin in numpy:
        assert pin.split(";")[0].split("==")[1] in readme


def test_the_kit_pins_the_torch_the_grader_is_given(tmp_path):
    """`make student-kit TORCH_SPEC=...` (a CUDA build on a GPU grader) pins that version, without its build."""
    kit.build_kit(tmp_path, torch_spec="torch==2.12.1+cu128 --index-url https://download.pytorch.org/whl/cu128")
    assert "torch==2.12.1\n" in (tmp_path / "mha-student-kit" / "requirements.txt").read_text()
    with pytest.raises(kit.KitError, match="must pin torch"):
        kit.build_kit(tmp_path, torch_spec="torch>=2")


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
    monkeypatch.setattr(kit, "kit_files", lambda root, torch_spec=None: leaky)
    with pytest.raises(kit.KitError, match="return torch.cat"):
        kit.build_kit(tmp_path)
    assert not (tmp_path / "mha-student-kit.zip").exists()


def selfcheck(path, cwd):
    return subprocess.run(
        [sys.executable, "selfcheck.py", str(path)], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def answered(tmp_path, name: str, answers: dict[str, str] | None = None, others="reference") -> Path:
    """The release with the reference's answers, but `answers` (by answer cell id), as `name`."""
    course = ROOT / "assignments"
    release = nbformat.read(course / "release" / "mha" / "mha.ipynb", as_version=4)
    source = nbformat.read(course / "source" / "mha" / "mha.ipynb", as_version=4)
    path = tmp_path / name
    path.write_text(samples.render(samples.filled_release(release, source, answers or {}, others), name))
    return path


@pytest.mark.slow
def test_the_kits_self_check_reports_each_part_without_the_answer_key(built, tmp_path):
    folder = built / "mha-student-kit"
    parts = len(load_rubric().parts)  # one self-check cell per part
    untouched = selfcheck(folder / "mha.ipynb", folder)
    assert untouched.returncode == 1
    assert (
        f"0 of {parts} self-checks passed" in untouched.stdout and untouched.stdout.count("not done yet") == parts - 1
    )
    assert "speed    waiting:" in untouched.stdout  # speed has no code of its own: it waits for part 6
    solved = selfcheck(answered(tmp_path, "mha.py"), folder)
    assert solved.returncode == 0, solved.stdout + solved.stderr
    # the quiz's answers are only the grader's to judge: answered, never "passed"
    assert f"{parts - 1} of {parts} self-checks passed, 1 answered" in solved.stdout
    assert "quiz     answered:" in solved.stdout
    wrong = answered(tmp_path, "mha.ipynb", {"answer-combine": "return torch.cat(outputs, dim=1)"})
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
    # it ran, so it exits 0 (no "make: *** Error"), and its last line says how many parts passed
    assert done.returncode == 0 and "combine  failed" in done.stdout and "***" not in done.stderr
    assert re.fullmatch(r"\d of 8 self-checks passed.*", done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_self_check_that_is_not_right_yet_never_says_passed(built, tmp_path):
    """What a self-check returns is its verdict: a part whose own code is right but whose result is not (a
    wrapper over a wrong combine, the speed of a wrong forward, a fused module over a wrong forward) is
    `waiting`, naming the part to fix; a wrong quiz answer is `answered`. None of them is `passed`."""
    wrong = answered(
        tmp_path,
        "mha.py",
        {
            "answer-combine": "return torch.cat(outputs[::-1], dim=-1)",
            "answer-HEADS_RUN": 'HEADS_RUN = "A"',
            "answer-MultiHeadAttention": (
                "b, num_tokens, d_in = x.shape\nreturn self.out_proj(self.W_value(x))  # no attention at all"
            ),
        },
    )
    done = selfcheck(wrong, built / "mha-student-kit")
    verdicts = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.split(None, 1)[0] in PARTS)
    assert verdicts["combine"].startswith("failed:")
    assert verdicts["wrapper"].startswith("waiting:") and "see the combine self-check" in verdicts["wrapper"]
    assert verdicts["quiz"].startswith("answered:")
    assert verdicts["mha"].startswith("failed:")
    assert verdicts["speed"].startswith("waiting:") and "part 6" in verdicts["speed"]
    assert verdicts["fuse"].startswith("waiting:")
    assert verdicts["two_dim"].startswith("waiting:") and verdicts["columns"].startswith("passed:")
    assert "1 of 8 self-checks passed, 1 answered" in done.stdout and done.returncode == 1


def test_the_self_check_numbers_cells_and_lines_as_the_grader_does():
    """The same location for a problem: the cell as the student sees it (markdown cells count) and the line
    of the file (of the cell, in a notebook), whatever the file."""
    from autograder.authoring import selfcheck as check
    from autograder.grading.submission import read_cells

    files = [ROOT / "assignments" / "release" / "mha" / n for n in ("mha.ipynb", "mha.py")] + [REFERENCE]
    files += sorted((ROOT / "assignments" / "submitted").glob("*/mha/mha.*"))
    for path in files:
        grader = [(c.number, c.line) for c in read_cells(path)]
        mine = [(c.number, c.line) for c in check.cells_of(path)]
        assert mine == grader, path


@pytest.mark.slow
def test_the_self_check_and_the_grader_point_at_the_same_line(built, tmp_path):
    """A forward that raises: both name the same cell and the same line of the file."""
    path = answered(
        tmp_path,
        "mha.py",
        {"answer-MultiHeadAttention": "b, num_tokens, d_in = x.shape\nraise RuntimeError('a bug of mine')"},
    )
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "a bug of mine" in text)
    done = selfcheck(path, built / "mha-student-kit")
    results, _ = grade(path, tmp_path)
    graded = next(t["output"] for t in results["tests"] if t["tags"][0] == "mha" and "a bug of mine" in t["output"])
    where = re.search(r'File "<mha.py, cell (\d+)>", line (\d+)', graded)
    assert where and int(where.group(2)) == line
    assert f'File "<mha.py, cell {where.group(1)}>", line {line}' in done.stdout


@pytest.mark.slow
def test_a_student_sets_up_the_kit_from_the_zip_and_checks_the_file_they_work_on(built, tmp_path):
    """As the kit's README says: unzip, a virtualenv, pip install -r requirements.txt, make check. The
    virtualenv reuses this project's packages (a .pth file) and pip may not use the network: the pins must
    be what the grader runs, and already satisfied by them."""
    with zipfile.ZipFile(built / "mha-student-kit.zip") as bundle:
        bundle.extractall(tmp_path)
    folder = tmp_path / "mha-student-kit"
    run = lambda *command, **kw: subprocess.run(  # noqa: E731
        command, cwd=folder, capture_output=True, text=True, timeout=600, **kw
    )
    # without its own pip and setuptools: this project's (newer, as torch needs) come with its packages
    assert run(sys.executable, "-m", "venv", "--without-pip", ".venv").returncode == 0
    python = folder / ".venv" / "bin" / "python"
    site = run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site) / "grader-packages.pth").write_text("\n".join(ours) + "\n")
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    installed = run(str(python), "-m", "pip", "install", "-r", "requirements.txt", env=offline)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    untouched = run("make", "--no-print-directory", "check")
    assert "checking mha.ipynb (mha.ipynb and mha.py hold the same code)" in untouched.stdout
    assert untouched.stdout.count("not done yet") == len(PARTS) - 1  # and speed waits for part 6
    assert untouched.returncode == 0 and "***" not in untouched.stderr  # it ran: a summary, not a make error
    assert untouched.stdout.splitlines()[-1].startswith(f"0 of {len(PARTS)} self-checks passed")

    (folder / "mha.py").write_text(answered(tmp_path, "mha.py").read_text())  # the student works in mha.py
    solved = run("make", "--no-print-directory", "check")
    assert "checking mha.py, the one with fewer stubs left (0; mha.ipynb has 10)" in solved.stdout, solved.stdout
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert f"{len(PARTS) - 1} of {len(PARTS)} self-checks passed, 1 answered" in solved.stdout
    assert "Warning" not in solved.stderr, solved.stderr  # no NumPy of another series


def test_speed_waits_for_a_wrong_combine_as_the_other_parts_do(built, tmp_path):
    """Only combine is wrong: the wrapper the self-check times against gives another shape, so speed waits for
    it (the grader times against its own wrapper and is not affected), rather than failing with a shape."""
    wrong = answered(tmp_path, "mha.py", {"answer-combine": "return torch.cat(outputs, dim=1)"})
    done = selfcheck(wrong, built / "mha-student-kit")
    verdicts = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.split(None, 1)[0] in PARTS)
    assert verdicts["combine"].startswith("failed:") and verdicts["mha"].startswith("passed:")
    # the wrapper and combine are the notebook's part 3 (part 2 has no self-check)
    assert verdicts["speed"].startswith("waiting:") and "part 3" in verdicts["speed"], verdicts["speed"]
    assert "part 2" not in verdicts["speed"]
    assert "shape" not in verdicts["speed"]


def test_a_syntax_error_is_one_diagnosis_at_the_files_line_and_what_needs_it_waits(built, tmp_path):
    path = answered(tmp_path, "mha.py")
    source = path.read_text()
    assert source.count("return torch.cat(outputs, dim=-1)\n") == 1
    path.write_text(source.replace("return torch.cat(outputs, dim=-1)\n", "return torch.cat(outputs, dim=-1\n"))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "torch.cat(outputs, dim=-1" in text)
    done = selfcheck(path, built / "mha-student-kit")
    said = done.stdout + done.stderr
    assert said.count("SyntaxError") == 1 and f", line {line}: SyntaxError:" in done.stderr, said
    assert "NameError" not in said
    verdicts = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.split(None, 1)[0] in PARTS)
    # failed in its own part, and nowhere else: what needs combine waits for it
    assert verdicts["combine"].startswith("failed:") and f"(line {line}), which defines combine" in verdicts["combine"]
    for part in ("wrapper", "fuse"):
        assert verdicts[part].startswith("waiting:") and f"(line {line}), which defines combine" in verdicts[part]
    assert verdicts["columns"].startswith("passed:") and done.returncode == 1


def test_fuse_waits_for_wrong_column_ranges_and_a_missing_file_says_so(built, tmp_path):
    """fuse_heads written right, head_column_ranges inclusive: fuse's self-check waits for part 5 (its own code
    is right), columns fails. A file that is not there is named as missing."""
    path = answered(tmp_path, "mha.py")
    right = "return [(h * width, (h + 1) * width) for h in range(num_heads)]"
    assert path.read_text().count(right) == 1
    path.write_text(path.read_text().replace(right, right.replace("(h + 1) * width)", "(h + 1) * width - 1)")))
    done = selfcheck(path, built / "mha-student-kit")
    verdicts = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.split(None, 1)[0] in PARTS)
    assert verdicts["columns"].startswith("failed:") and "inclusive" in verdicts["columns"]
    assert verdicts["fuse"].startswith("waiting:") and "part 5" in verdicts["fuse"], verdicts["fuse"]
    missing = selfcheck(tmp_path / "missing.py", built / "mha-student-kit")
    assert missing.returncode == 2 and "no such file" in missing.stderr, missing.stderr
