"""Fixtures shared by the project's tests; the helpers they use live in helpers.py."""

import pytest

from helpers import REFERENCE, grade


@pytest.fixture(scope="session")
def reference_results(tmp_path_factory) -> dict:
    """The reference solution graded once per test session."""
    results, run = grade(REFERENCE, tmp_path_factory.mktemp("reference"))
    assert run.returncode == 0, run.stderr
    return results
