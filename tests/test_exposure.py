"""What of the grader's own files a worker's fresh uid could read outside the namespace sandbox, decided from the
permission bits as the kernel decides for a uid that owns nothing and is in no group; and the fix, closing the
fewest paths, never the interpreter the worker runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.sandbox import exposure, probe
from helpers import ROOT

THE_LAUNCHERS_RULE = exposure.fresh_uid_outside_sandbox


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


def the_grader_of(project: Path, monkeypatch) -> Path:
    """The grader taken to be `project`'s, run by its `.venv`, each worker a fresh uid outside the sandbox;
    the rubric's path."""
    monkeypatch.setattr(exposure.bwrap, "grader_folders", lambda: [str(project)])
    monkeypatch.setattr(exposure.bwrap, "PROJECT_ROOT", project)
    monkeypatch.setattr(exposure, "interpreter_folders", lambda: (str(project / ".venv"),))
    monkeypatch.setattr(exposure, "reference_folder", lambda: str(project / "reference"))
    monkeypatch.setattr(exposure, "fresh_uid_outside_sandbox", lambda isolation: True)
    return project / "autograder" / "rubric.toml"


def modes(project: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_mode, p.lstat().st_uid) for p in [project, *project.rglob("*")]}


def test_the_grader_closes_its_own_files_itself_and_keeps_the_way_to_its_virtualenv(open_folder, monkeypatch):
    project = a_checkout(open_folder)
    rubric = the_grader_of(project, monkeypatch)
    assert exposure.problem("auto", rubric) == ""  # nothing to refuse: the grader closes them itself
    closed = exposure.close_own("auto", rubric)
    assert sorted(Path(p).name for p in closed) == ["README.md", "assignments", "autograder", "reference"]
    assert exposure.to_close([str(project), str(rubric)], (str(project / ".venv"),)) == {}
    assert exposure.reachable_by_others(str(project / ".venv" / "lib" / "python3" / "site-packages" / "torch"))
    assert exposure.first_readable(str(project / ".venv")) is not None  # the worker still runs it
    assert exposure.close_own("auto", rubric) == []  # said once: nothing is left to close


def test_a_chmod_that_fails_stops_the_grading(open_folder, monkeypatch):
    project = a_checkout(open_folder)
    rubric = the_grader_of(project, monkeypatch)

    def refused(path: str, mode: int, follow_symlinks: bool = True) -> None:
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(exposure.os, "chmod", refused)
    with pytest.raises(exposure.CannotClose, match="could not close the grader's own files to other users"):
        exposure.close_own("auto", rubric)


def test_the_checkouts_virtualenv_is_kept_whichever_interpreter_grades(open_folder, monkeypatch):
    """A grader run by another interpreter than the checkout's `.venv` (which `make` uses) never closes it."""
    project = a_checkout(open_folder)
    (project / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    monkeypatch.setattr(exposure.bwrap, "PROJECT_ROOT", project)
    assert str(project / ".venv") in exposure.interpreter_folders()
    closing = exposure.to_close([str(project)], exposure.interpreter_folders())
    assert str(project) not in closing and str(project / "reference") in closing


def another_users(project: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving the checkout to another user needs root")
    subprocess.run(["chown", "-R", "12345:12345", str(project)], check=True)


def test_another_users_checkout_is_left_as_it_is_and_refused_with_a_command_that_closes_it(open_folder, monkeypatch):
    project = a_checkout(open_folder)
    rubric = the_grader_of(project, monkeypatch)
    another_users(project)
    before = modes(project)
    assert exposure.close_own("auto", rubric) == [] and modes(project) == before
    said = exposure.problem("auto", rubric)
    assert f"the reference's solution ({project / 'reference'})" in said and f"the rubric ({rubric})" in said
    assert "owned by uid 12345, not the grader's" in said and "as root" not in said
    command = said.split("Close them to other users first: ", 1)[1]
    assert command.startswith("chmod o-rwx ") and str(project / ".venv") not in command
    subprocess.run(shlex.split(command), check=True)  # the advice, followed literally
    assert exposure.problem("auto", rubric) == ""
    assert exposure.first_readable(str(project / ".venv")) is not None
    # only where a worker would run as a fresh uid outside the namespace sandbox
    monkeypatch.setattr(exposure, "fresh_uid_outside_sandbox", THE_LAUNCHERS_RULE)
    monkeypatch.setattr(probe, "choose_isolation", lambda wanted: "namespace")
    (project / "reference" / "mha.py").chmod(0o644)
    (project / "reference").chmod(0o755)
    assert exposure.problem("auto", rubric) == "" and exposure.close_own("auto", rubric) == []
    assert (project / "reference").stat().st_mode & 0o007 == 0o005


def test_a_read_only_checkout_is_refused_with_a_command_for_where_it_is_writable(open_folder, monkeypatch):
    """The command names the paths from the checkout's top folder, so that it runs where the checkout is
    mounted from, whatever its path there."""
    project = a_checkout(open_folder)
    rubric = the_grader_of(project, monkeypatch)
    monkeypatch.setattr(exposure, "why_not_closable", lambda path: "on a read-only file system")
    before = modes(project)
    assert exposure.close_own("auto", rubric) == [] and modes(project) == before
    said = exposure.problem("auto", rubric)
    assert "is on a read-only file system" in said
    command = said.split("in its top folder: ", 1)[1]
    assert command == "chmod o-rwx README.md assignments autograder reference"
    subprocess.run(shlex.split(command), check=True, cwd=project)  # followed literally, in the top folder
    assert exposure.problem("auto", rubric) == ""


def test_the_grader_closes_only_what_it_owns_on_a_writable_file_system(open_folder):
    project = a_checkout(open_folder)
    reference = str(project / "reference")
    assert exposure.why_not_closable(reference) == ""
    assert exposure.why_not_closable(str(project / "missing")) != ""
    another_users(project)
    assert exposure.why_not_closable(reference) == "owned by uid 12345, not the grader's"
    subprocess.run(["chown", "-R", "0:0", str(project)], check=True)
    # the checkout mounted read-only, in a mount namespace of its own
    said = subprocess.run(
        [
            "unshare", "-m", "sh", "-c",
            f"mount --bind {project} {project} && mount -o remount,bind,ro {project} && "
            f"{sys.executable} -c 'import sys; from autograder.sandbox import exposure; "
            "print(exposure.why_not_closable(sys.argv[1]))' " + reference,
        ],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert said.stdout.strip() == "on a read-only file system", said.stderr


def test_a_fresh_uid_shut_out_of_the_interpreter_is_given_the_command_that_opens_it(open_folder):
    """A root grader whose fresh uid cannot read the interpreter (a virtualenv under a 0700 home, a checkout
    closed whole) is told the command that lets it in; followed literally, a fresh uid reaches and reads
    every file of it, and nothing is left to open."""
    home = open_folder / "home"
    venv = home / "checkout" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "torch").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "lib" / "torch" / "__init__.py").write_text("")
    (venv / "bin" / "python").chmod(0o700)
    (venv / "lib" / "torch" / "__init__.py").chmod(0o600)
    (venv / "lib").chmod(0o700)
    home.chmod(0o700)
    (home / "checkout").chmod(0o750)
    paths = [str(venv / "bin" / "python"), str(venv / "lib")]
    command = exposure.opening(paths)
    assert command == (
        f"chmod o+x {home} {home / 'checkout'} && chmod -R o+rX {venv / 'lib'} {venv / 'bin' / 'python'}"
    )
    subprocess.run(command, shell=True, check=True)  # the advice, followed literally
    assert exposure.opening(paths) == ""
    assert exposure.reachable_by_others(str(venv / "lib" / "torch"))
    assert exposure.first_readable(str(venv / "lib")) == str(venv / "lib" / "torch" / "__init__.py")
    assert os.stat(venv / "bin" / "python").st_mode & 0o005 == 0o005
    assert exposure.first_readable(str(home / "checkout" / "README.md")) is None  # nothing else was opened
