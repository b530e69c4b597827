"""`make test-pythons`: it skips the Python that `make test` already runs, also when it is found through a
pyenv shim (a script that runs the real interpreter), whose own path is not the interpreter's; its Pythons'
virtualenvs share the files they have alike, and `--discard` leaves none behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import shared_files  # noqa: E402  (tools/ is not a package)
import test_pythons  # noqa: E402


def test_a_shim_is_resolved_to_the_interpreter_it_runs(tmp_path):
    shim = tmp_path / "python3.x"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    real = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    assert os.path.realpath(shim) != real  # what the comparison used to see: a duplicate run
    assert test_pythons.real_interpreter(str(shim)) == real
    assert test_pythons.real_interpreter(str(tmp_path / "missing")) is None


def test_a_virtualenvs_interpreter_is_the_python_it_was_made_from():
    """`make test-pythons` runs with .venv/bin first on PATH: its python3.X (a copy, or a link) is the
    default Python, which `make test` already covers."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtualenv")
    venv = Path(sys.prefix)
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    assert test_pythons.real_interpreter(str(venv / "bin" / "python")) == base == test_pythons.base_of(venv)


def fake_venv(root: Path, minor: str, files: dict[str, bytes], mode: int = 0o644) -> Path:
    site = root / "lib" / f"python{minor}" / "site-packages"
    for relative, data in files.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    return root


def test_identical_files_of_two_pythons_virtualenvs_become_one(tmp_path):
    """PyPI's torch for Python 3.10 and for 3.12 carry the same CUDA runtime: one copy on disk, not one per
    Python. A file that differs in its bytes, its mode or its place stays a file of its own."""
    runtime = b"\x7fELF" + bytes(range(256)) * 64
    first = fake_venv(
        tmp_path / "3.10",
        "3.10",
        {"nvidia/cublas/lib/libcublas.so.13": runtime, "torch/_C.so": b"for 3.10", "torch/version.py": b"v"},
    )
    second = fake_venv(
        tmp_path / "3.12",
        "3.12",
        {
            "nvidia/cublas/lib/libcublas.so.13": runtime,
            "torch/_C.so": b"for 3.12",  # the same size, other bytes
            "elsewhere/version.py": b"v",  # the same bytes, another place
        },
    )
    script = second / "lib/python3.12/site-packages/torch/run.sh"
    script.write_bytes(b"#!/bin/sh\n")
    script.chmod(0o755)
    (first / "lib/python3.10/site-packages/torch/run.sh").write_bytes(b"#!/bin/sh\n")  # the same bytes, mode 0644

    assert shared_files.share_identical_files(second, [first]) == len(runtime)

    def inode(venv: Path, minor: str, relative: str) -> int:
        return (venv / "lib" / f"python{minor}" / "site-packages" / relative).stat().st_ino

    assert inode(first, "3.10", "nvidia/cublas/lib/libcublas.so.13") == inode(
        second, "3.12", "nvidia/cublas/lib/libcublas.so.13"
    )
    assert inode(first, "3.10", "torch/_C.so") != inode(second, "3.12", "torch/_C.so")
    assert inode(first, "3.10", "torch/run.sh") != inode(second, "3.12", "torch/run.sh")
    assert (second / "lib/python3.12/site-packages/torch/_C.so").read_bytes() == b"for 3.12"
    assert os.access(script, os.X_OK)
    assert not list(second.rglob(".*.shared"))
    assert shared_files.share_identical_files(second, [first]) == 0  # shared already: nothing more to save
    assert shared_files.share_identical_files(second, []) == 0


def test_a_discarded_pythons_virtualenv_and_tree_are_gone(tmp_path, monkeypatch):
    """`--discard` (.ci/run) leaves no Python's virtualenv behind, passed or failed: a CI machine's disk may
    be small."""
    monkeypatch.setattr(test_pythons, "ROOT", tmp_path)
    monkeypatch.setattr(test_pythons, "_made", [])
    made: list[Path] = []

    def copy_of_tree(name):
        made.append(tmp_path / ".venvs" / f"{name}.src")
        made[-1].mkdir(parents=True, exist_ok=True)
        return made[-1]

    def fake_run(command, **kwargs):
        if command[0] == "make":  # make setup: a virtualenv with one file
            fake_venv(tmp_path / ".venvs" / "3.10", "3.10", {"torch/__init__.py": b""})
        return subprocess.CompletedProcess(command, 1 if command[0] != "make" else 0)

    monkeypatch.setattr(test_pythons, "copy_of_tree", copy_of_tree)
    monkeypatch.setattr(test_pythons.subprocess, "run", fake_run)
    kept = test_pythons.run_one("3.10", sys.executable, "torch", [])
    assert kept[:2] == ("passed", "failed (exit 1)")
    assert (tmp_path / ".venvs" / "3.10").is_dir() and made[-1].is_dir()
    discarded = test_pythons.run_one("3.10", sys.executable, "torch", [], discard=True)
    assert discarded[:2] == ("passed", "failed (exit 1)")
    assert not (tmp_path / ".venvs" / "3.10").exists() and not made[-1].exists()
    assert tmp_path / ".venvs" / "3.10" not in test_pythons._made
