"""What of the grader's own files a worker's fresh uid could read outside the namespace sandbox, decided from the
permission bits as the kernel decides for a uid that owns nothing and is in no group; and the fix, closing the
fewest paths, never the interpreter the worker runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest

from autograder.sandbox import exposure, probe


@pytest.fixture
def open_folder():
    """A folder every user can reach (pytest's own temporary folders are closed to other users)."""
    with tempfile.TemporaryDirectory(prefix="mha-exposure-") as folder:
        os.chmod(folder, 0o755)
        assert exposure.reachable_by_others(folder), f"{tempfile.gettempdir()} is closed to other users here"
        yield Path(folder)


def a_checkout(root: Path) -> Path:
    """A checkout as `git clone` leaves it (0755 folders, 0644 files), its virtualenv inside."""
    project = root / "checkout"
    for name, text in {
        "reference/mha.py": "# the solution\n",
        "autograder/rubric.toml": "[parts]\n",
        "autograder/grading/checks/test_mha.py": "# a hidden check\n",
        "assignments/source/mha/mha.ipynb": "{}\n",
        "README.md": "read me\n",
        ".venv/bin/python": "",
        ".venv/lib/python3/site-packages/torch/__init__.py": "",
    }.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root, *(p for p in project.rglob("*") if p.is_dir()), project]:
        folder.chmod(0o755)
    for file in (p for p in project.rglob("*") if p.is_file()):
        file.chmod(0o644)
    return project


def test_a_world_readable_checkout_is_closed_by_the_fewest_paths_never_the_interpreter(open_folder):
    project = a_checkout(open_folder)
    keep = (str(project / ".venv"),)
    closing = exposure.to_close([str(project), str(project / "autograder" / "rubric.toml")], keep)
    assert sorted(Path(p).name for p in closing) == ["README.md", "assignments", "autograder", "reference"]
    assert closing[str(project / "reference")] == str(project / "reference" / "mha.py")
    for path in closing:
        os.chmod(path, os.stat(path).st_mode & ~0o007)
    assert exposure.to_close([str(project)], keep) == {}
    assert exposure.first_readable(str(project / ".venv" / "lib")) is not None  # the worker still runs it


def test_the_graders_packages_installed_in_the_interpreters_folder_are_checked_all_the_same(open_folder):
    """Installed (not a checkout), `autograder` and `reference` sit in the virtualenv's site-packages, which the
    worker must read: those two folders are still the grader's, and are closed."""
    site = open_folder / "venv" / "lib" / "python3" / "site-packages"
    for name in ("reference/mha.py", "autograder/rubric.toml", "torch/__init__.py"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    for path in [open_folder / "venv", *(open_folder / "venv").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    closing = exposure.to_close([str(site / "autograder"), str(site / "reference")], (str(open_folder / "venv"),))
    assert sorted(closing) == [str(site / "autograder"), str(site / "reference")]


def test_group_and_owner_bits_and_closed_folders_above_hide_a_file_others_bits_show_it(open_folder):
    project = a_checkout(open_folder)
    solution = project / "reference" / "mha.py"
    solution.chmod(0o640)  # the owner and the group: not a fresh uid
    assert exposure.first_readable(str(project / "reference")) is None
    solution.chmod(0o604)
    assert exposure.first_readable(str(project / "reference")) == str(solution)
    (project / "reference").chmod(0o754)  # listed, not entered
    assert exposure.first_readable(str(project / "reference")) is None
    (project / "reference").chmod(0o755)
    open_folder.chmod(0o750)  # a folder above closes everything below it
    assert exposure.to_close([str(project)], ()) == {}
    assert not exposure.reachable_by_others(str(project))


def test_links_are_not_followed_out_of_what_is_checked(open_folder):
    project = a_checkout(open_folder)
    (project / "reference" / "mha.py").chmod(0o600)
    outside = open_folder / "public.txt"
    outside.write_text("nothing secret\n")
    outside.chmod(0o644)
    (project / "reference" / "link.txt").symlink_to(outside)
    assert exposure.first_readable(str(project / "reference")) is None


def test_the_refusal_names_the_solution_and_a_command_that_closes_it(open_folder, monkeypatch):
    project = a_checkout(open_folder)
    rubric = project / "autograder" / "rubric.toml"
    monkeypatch.setattr(exposure.bwrap, "grader_folders", lambda: [str(project)])
    monkeypatch.setattr(exposure, "interpreter_folders", lambda: (str(project / ".venv"),))
    monkeypatch.setattr(exposure, "reference_folder", lambda: str(project / "reference"))
    said = exposure.refusal(rubric)
    assert f"the reference's solution ({project / 'reference'})" in said and f"the rubric ({rubric})" in said
    command = said.split("Close them to other users first: ", 1)[1]
    assert command.startswith("chmod o-rwx ") and str(project / ".venv") not in command
    subprocess.run(shlex.split(command), check=True)  # the advice, followed literally
    assert exposure.refusal(rubric) == ""
    # only where a worker would run as a fresh uid outside the namespace sandbox
    monkeypatch.setattr(probe, "choose_isolation", lambda wanted: "namespace")
    (project / "reference" / "mha.py").chmod(0o644)
    (project / "reference").chmod(0o755)
    assert exposure.refusal(rubric) != "" and exposure.problem("auto", rubric) == ""
