"""`make test-pythons` skips the Python that `make test` already runs, also when it is found through a
pyenv shim (a script that runs the real interpreter), whose own path is not the interpreter's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import test_pythons  # noqa: E402  (tools/ is not a package)


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
