"""Where the suite does not run as root, the tests that need root are said apart at the end (`root_report.py`)."""

import os

pytest_plugins = ["pytester"]

SUITE = """
import pytest

@pytest.mark.skipif(True, reason="the emulation runs as root (it makes namespaces, drops to users)")
def test_needs_root():
    pass

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_needs_cuda():
    pass

def test_runs():
    pass
"""


def test_the_tests_that_need_root_are_said_apart_where_the_run_is_not_root(pytester, monkeypatch):
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    said = pytester.runpytest_inprocess("-p", "root_report").stdout.str()
    section = said.split("not run here: these need root", 1)[1]
    assert "test_suite.py: 1 test\n" in section and "1 test that needs root did not run" in section
    assert "CUDA" not in section
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "not run here" not in pytester.runpytest_inprocess("-p", "root_report").stdout.str()
