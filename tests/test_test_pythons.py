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


def fake_dist(venv: Path, minor: str, name: str, version: str, tag: str, files: dict[str, bytes]) -> None:
    site = venv / "lib" / f"python{minor}" / "site-packages"
    dist_info = f"{name}-{version}.dist-info"
    for relative, data in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(data)
    (site / dist_info).mkdir(parents=True)
    (site / dist_info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
    (site / dist_info / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
    listed = [*files, f"{dist_info}/WHEEL", f"{dist_info}/METADATA", f"{dist_info}/RECORD"]
    (site / dist_info / "RECORD").write_text("".join(f"{path},,\n" for path in listed))


def test_a_new_virtualenv_takes_cudas_runtime_from_another_not_from_the_index(tmp_path):
    """What pip is about to install that another Python's virtualenv has from a wheel for any Python (CUDA's
    runtime) is linked in first, so pip finds it installed; a pure-Python or a Python-specific wheel, another
    version, one with files outside site-packages, or one the virtualenv has already, is left to pip."""
    donor = tmp_path / "3.10"
    fake_dist(
        donor,
        "3.10",
        "nvidia_cublas",
        "13.1.1.3",
        "py3-none-manylinux_2_27_x86_64",
        {"nvidia/cublas/lib/libcublas.so.13": b"ELF", "nvidia/cublas/__pycache__/x.cpython-310.pyc": b"pyc"},
    )
    fake_dist(donor, "3.10", "sympy", "1.14.0", "py3-none-any", {"sympy/__init__.py": b""})
    fake_dist(donor, "3.10", "triton", "3.7.1", "cp310-cp310-manylinux_2_27_x86_64", {"triton/_C.so": b"ELF"})
    fake_dist(donor, "3.10", "nvidia_nccl_cu13", "2.29.6", "py3-none-manylinux_2_18_x86_64", {"nvidia/nccl": b"o"})
    fake_dist(donor, "3.10", "nvidia_tool", "1.0", "py3-none-manylinux_2_18_x86_64", {"../../../bin/tool": b"x"})
    fake_dist(donor, "3.10", "nvidia_nvtx", "13.0.85", "py3-none-manylinux1_x86_64", {"nvidia/nvtx/a.so": b"1"})
    target = tmp_path / "3.12"
    fake_dist(target, "3.12", "nvidia_nvtx", "13.0.84", "py3-none-manylinux1_x86_64", {"nvidia/nvtx/a.so": b"0"})
    wanted = {
        "nvidia-cublas": "13.1.1.3",
        "sympy": "1.14.0",
        "triton": "3.7.1",
        "nvidia-nccl-cu13": "2.29.7",
        "nvidia-tool": "1.0",
        "nvidia-nvtx": "13.0.85",
    }
    assert shared_files.seed_distributions(target, wanted, [donor]) == ["nvidia-cublas"]
    site, theirs = target / "lib/python3.12/site-packages", donor / "lib/python3.10/site-packages"
    library = "nvidia/cublas/lib/libcublas.so.13"
    assert (site / library).stat().st_ino == (theirs / library).stat().st_ino
    assert (site / "nvidia_cublas-13.1.1.3.dist-info" / "RECORD").is_file()
    assert not (site / "nvidia/cublas/__pycache__").exists()  # 3.10's bytecode is not 3.12's
    assert not (site / "sympy").exists() and not (site / "triton").exists() and not (site / "nvidia/nccl").exists()
    assert (site / "nvidia/nvtx/a.so").read_bytes() == b"0"
    assert not (target / "bin").exists()
    assert shared_files.seed_distributions(target, wanted, [donor]) == []  # installed now
