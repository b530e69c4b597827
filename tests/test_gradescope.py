"""Gradescope's autograder zip, run as Gradescope runs it, against a fake /autograder tree."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

from classkit import ROOT
from helpers import REFERENCE, autograder


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    done = autograder("gradescope", "--out", out, timeout=300)
    assert done.returncode == 0, done.stderr
    return out / "mha-gradescope.zip"


def fake_autograder(tmp_path, archive, files: dict[str, str]):
    """/autograder as Gradescope lays it out: the zip unpacked in source/, run_autograder copied beside
    it, the student's files in submission/, an empty results/."""
    root = tmp_path / "autograder"
    unpack(archive, root)
    (root / "submission").mkdir()
    (root / "results").mkdir()
    for name, text in files.items():
        (root / "submission" / name).write_text(text)
    return root


def unpack(archive, root):
    """What Gradescope does with the zip: unpacked in ROOT/source/, run_autograder copied to ROOT/."""
    with zipfile.ZipFile(archive) as bundle:
        bundle.extractall(root / "source")
        for info in bundle.infolist():
            os.chmod(root / "source" / info.filename, info.external_attr >> 16)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")


def run_autograder(root, **env):
    environment = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable, **env)
    return subprocess.run([str(root / "run_autograder")], capture_output=True, text=True, timeout=900, env=environment)


def test_the_zip_has_gradescopes_two_scripts_and_the_grader(archive):
    with zipfile.ZipFile(archive) as bundle:
        names = set(bundle.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in bundle.infolist()}
        setup = bundle.read("setup.sh").decode()
        requirements = bundle.read("requirements.txt").decode()
        shipped = {name: bundle.read(name) for name in ("setup.sh", "run_autograder", "requirements.lock")}
    assert {
        "setup.sh",
        "run_autograder",
        "requirements.txt",
        "requirements.lock",
        "autograder/grading/grade.py",
        "autograder/rubric.toml",
        "reference/mha.py",
        "pyproject.toml",
    } <= names
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "source/"))]
    # the scripts as shipped in deploy/gradescope/, the lock as the project's
    for name, text in shipped.items():
        assert (
            text
            == (ROOT / ("requirements.lock" if name.endswith(".lock") else f"deploy/gradescope/{name}")).read_bytes()
        )
    assert "bubblewrap" in setup and 'chmod -R go-rwx "$SOURCE"' in setup  # the worker's uid cannot read the grader
    assert "--constraint" in setup and "requirements.lock" in setup  # exactly the locked versions
    assert "nbgrader==0.9.6; python_version >= '3.11'" in requirements.splitlines()


def test_nothing_submitted_still_gives_results_json(tmp_path, archive):
    root = fake_autograder(tmp_path, archive, {})
    done = run_autograder(root)
    assert done.returncode == 0, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and "no mha.ipynb or mha.py was submitted" in results["output"]


@pytest.mark.slow
def test_a_submission_is_graded_into_results_json_with_the_students_code_as_another_user(tmp_path, archive):
    """The student's code finds out whether it can read the grader's source: the answer it gives
    (HEADS_RUN) is right only if it cannot. Under a root grader the worker is sandboxed and a fresh
    unprivileged uid, so it cannot."""
    as_root = os.geteuid() == 0
    root = tmp_path / "autograder"
    probe = (
        f"import os as _os\n_grader = {str(root / 'source' / 'reference' / 'mha.py')!r}\n"
        "try:\n    open(_grader).read()\n    _READ = True\nexcept OSError:\n    _READ = False\n\n"
    )
    source = REFERENCE.read_text().replace('HEADS_RUN = "B"', 'HEADS_RUN = "A" if _READ else "B"')
    root = fake_autograder(tmp_path, archive, {"mha (2).py": probe + source})
    os.chmod(root / "source", 0o700)  # as setup.sh leaves it
    done = run_autograder(root)
    assert done.returncode == 0, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["extra_data"]["isolation"] in ("namespace", "process")
    assert "Graded mha (2).py." in results["output"]
    if as_root:
        assert results["score"] == results["max_score"] == 100, results["output"]
        assert "the grader's own user" not in results["extra_data"]["sandbox"]["user"]
    else:  # not root: no uid change, but still graded, the answer being whatever the file system allows
        assert results["max_score"] == 100


# -- links, FIFOs and a grader killed midway (the shared runner, platforms/folder.py) -----------------


def test_a_link_to_the_reference_is_never_graded(tmp_path, archive):
    """A submission that is a symbolic link to the grader's own reference scored 100/100 when it was
    followed: now it is refused, with a note, and nothing is graded."""
    root = fake_autograder(tmp_path, archive, {})
    (root / "submission" / "mha.py").symlink_to(root / "source" / "reference" / "mha.py")
    (root / "submission" / "answers").symlink_to(root / "source" / "reference", target_is_directory=True)
    done = run_autograder(root)
    assert done.returncode == 0, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["extra_data"]["status"] == "cannot_grade"
    assert "mha.py is a symbolic link out of the folder, not followed" in results["output"]


def test_what_the_runner_finds_and_copies_stays_inside_the_submission_folder(tmp_path):
    from autograder.platforms.folder import CannotCopy, copy_submission, find_submission

    folder = tmp_path / "submission"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "mine.py").write_text("x = 1\n")
    (folder / "mha.py").symlink_to("src/mine.py")  # inside: followed
    (folder / "secret.py").symlink_to(REFERENCE)  # outside: refused
    os.mkfifo(folder / "fifo.py")  # not a regular file: never opened
    found = find_submission(folder)
    assert found.file == folder / "mha.py" and found.refused == [
        "secret.py is a symbolic link out of the folder, not followed"
    ]
    assert "Not graded: secret.py is a symbolic link out" in found.note
    work = tmp_path / "work"
    work.mkdir()
    copy = copy_submission(found.file, folder, work)
    assert copy == work / "mha.py" and copy.read_text() == "x = 1\n" and not copy.is_symlink()
    with pytest.raises(CannotCopy, match="symbolic link out of the submission folder"):
        copy_submission(folder / "secret.py", folder, tmp_path / "work2")
    assert find_submission(tmp_path / "empty").file is None
    nested = tmp_path / "repo"
    (nested / "deep").mkdir(parents=True)
    (nested / "deep" / "MHA.PY").write_text("y = 2\n")
    (nested / "deep" / "link.ipynb").symlink_to(tmp_path / "submission" / "src" / "mine.py")
    found = find_submission(nested)
    assert found.file == nested / "deep" / "MHA.PY" and "deep/link.ipynb is a symbolic link out" in found.note


def test_the_runner_writes_a_placeholder_results_json_before_grading(tmp_path, monkeypatch):
    """A grader killed while grading (for memory, say) leaves results.json saying so, not nothing."""
    from autograder.grading import grade
    from autograder.model import UNFINISHED
    from autograder.platforms.folder import grade_folder

    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "mha.py").write_text("x = 1\n")
    out = tmp_path / "results" / "results.json"
    seen = {}

    def killed(path, options):
        seen.update(json.loads(out.read_text()))
        raise MemoryError("the grader ran out of memory")

    monkeypatch.setattr(grade, "grade_submission", killed)
    with pytest.raises(MemoryError):
        grade_folder(tmp_path / "submission", out, device="cpu")
    assert seen["extra_data"]["status"] == "cannot_grade" and UNFINISHED in seen["output"]
    assert json.loads(out.read_text()) == seen  # what a killed grader leaves behind


def test_a_folder_grading_adopts_workers_started_before_the_graders_imports(tmp_path, monkeypatch):
    """Gradescope's and Classroom's gradings start their workers as `grade` does (`EarlyStart`), before the
    grader imports torch, pytest and the checks, and the grading adopts them."""
    from autograder.grading import workers
    from autograder.platforms.folder import grade_folder

    adopted = []
    original = workers.EarlyStart.adopt

    def adopt(self, *args, **kwargs):
        worker = original(self, *args, **kwargs)
        adopted.append(worker is not None)
        return worker

    monkeypatch.setattr(workers.EarlyStart, "adopt", adopt)
    folder = tmp_path / "submission"
    folder.mkdir()
    (folder / "mha.py").write_text("x = 1\n")
    run = grade_folder(folder, tmp_path / "results.json", device="cpu")
    assert run.status == "graded" and adopted == [True]
