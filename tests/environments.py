"""Where the environment matrix grades: the project, set up so that another uid can run it.

A checkout under root's home, or a virtualenv made from pyenv's Python (under /root, mode 0700), cannot
be read by a normal user nor by the fresh uid a worker runs as. So the normal-user and container cases
grade with a copy of the project in a folder everyone may reach (/var/tmp/mha-exercise-envs/<checkout>/),
and a virtualenv made there by Debian's own Python (/usr/bin/python3), with `tools/setup_venv.py` as
`make setup` does: remade only when its inputs change. The virtualenv is readable by every user; the
grader's own files are not (`close_to_workers`), as deploy/ closes them, since a worker's fresh uid must
not read them. Everything it needs is installed here when
missing (python3-venv, and python3-seccomp for tools/emulate.py), as root with apt-get.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import apt_packages  # noqa: E402  (tools/ is not a package)
import emulate  # noqa: E402
import shared_files  # noqa: E402

SYSTEM_PYTHON = emulate.SYSTEM_PYTHON
COPIED = ("pyproject.toml", "README.md", "requirements.lock", "autograder", "reference", "tools", "deploy")
NORMAL_UID = 1000


def base() -> Path:
    """A folder every user may read, one per checkout."""
    folder = Path("/var/tmp/mha-exercise-envs") / hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    for path in (folder.parent, folder):
        path.chmod(0o755)
    return folder


def readable_by_others(path: Path) -> bool:
    """Whether another user may reach and read `path` (every folder above it searchable)."""
    path = path.resolve()
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [*reversed(path.parents), path] if p.is_dir())


@cache
def system_project() -> Path:
    """A fresh copy of the project's code beside a virtualenv of Debian's Python, readable by everyone. Made
    once per content of the checkout: another process (`.ci/run` prepares it in a lane of its own, and runs
    three test processes at once) waits for it under a lock, and finds it made, touching nothing a grading there
    uses."""
    if os.geteuid() != 0:
        raise RuntimeError("the environment matrix runs as root (it emulates the other users itself)")
    project = base() / "project"
    stamp = base() / "project.made"
    with open(base() / "project.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        made = content_digest()
        if stamp.exists() and stamp.read_text() == made and (project / ".venv" / "bin" / "python").exists():
            return project
        stamp.unlink(missing_ok=True)
        make_system_project(project)
        stamp.write_text(made)
    return project


def content_digest() -> str:
    """What the copy is made of: every copied file's path and bytes, and the Python making the virtualenv."""
    found = hashlib.sha256(SYSTEM_PYTHON.encode())
    for name in COPIED:
        source = ROOT / name
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for path in files:
            if "__pycache__" in path.parts or any(part.endswith(".egg-info") for part in path.parts):
                continue
            found.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return found.hexdigest()


def make_system_project(project: Path) -> None:
    emulate.ensure_tools()
    ensure_venv_module()
    project.mkdir(exist_ok=True)
    for name in COPIED:
        target = project / name
        if target.is_dir():
            shutil.rmtree(target)
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, target)
    subprocess.run(["chmod", "-R", "a+rX", str(project)], check=True)
    subprocess.run([SYSTEM_PYTHON, "tools/setup_venv.py", "--venv", ".venv"], cwd=project, check=True)
    shared_files.share_identical_files(project / ".venv", [ROOT / ".venv"])  # the same wheels: 1.5 GB once
    subprocess.run(["chmod", "-R", "a+rX", str(project)], check=True)
    close_to_workers(project)


def close_to_workers(project: Path) -> None:
    """The grader's files (all but the virtualenv, which workers run) closed to other users, as deploy/'s
    recipes close them: a worker's fresh uid outside the sandbox must read none of them, or the grader refuses
    to start. They stay readable by the matrix's graders: the normal user (their owner), root of the pod's
    user namespace (their group: its gid 0 is emulate.POD_IDS[0] here) and root."""
    for entry in project.iterdir():
        if entry.name != ".venv":
            subprocess.run(["chown", "-R", f"{NORMAL_UID}:{emulate.POD_IDS[0]}", str(entry)], check=True)
            subprocess.run(["chmod", "-R", "o-rwx", str(entry)], check=True)


def ensure_venv_module():
    if subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True).returncode == 0:
        return
    why = apt_packages.install(["python3-venv"])
    if why:
        raise RuntimeError(f"Debian's python3-venv is needed: {why}")


def workspace(name: str, owner: int | None) -> Path:
    """An empty folder for one environment's course, owned by the user who grades there."""
    folder = base() / "runs" / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    if owner is not None:
        os.chown(folder, owner, owner)
    return folder


def give_to(path: Path, owner: int | None):
    if owner is not None:
        subprocess.run(["chown", "-R", f"{owner}:{owner}", str(path)], check=True)
