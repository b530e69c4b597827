"""Fixtures shared by the project's tests; the helpers they use live in helpers.py."""

import pytest

from browser import find_or_install_chromium
from helpers import REFERENCE, grade


@pytest.fixture(scope="session")
def reference_results(tmp_path_factory) -> dict:
    """The reference solution graded once per test session."""
    results, run = grade(REFERENCE, tmp_path_factory.mktemp("reference"))
    assert run.returncode == 0, run.stderr
    return results


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium, installed by the test when it is missing (as root)."""
    return find_or_install_chromium()
