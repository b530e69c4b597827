"""A pytest plugin (loaded by conftest.py): where the run is not root, the tests skipped because they need root are
said in a section of their own at the end, by file, so that a green run on such a runner does not pass for one
that ran them (the environment matrix, Slurm, the fresh-uid and container suites need root here)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

SECTION = "not run here: these need root"


def needs_root(report: pytest.TestReport) -> bool:
    """A skip whose reason says it needs root (or that it runs as root: the emulations)."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3 else ""
    return "root" in str(reason)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if os.geteuid() == 0:
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if needs_root(r)]
    if not skipped:
        return
    terminalreporter.section(SECTION, sep="=", yellow=True, bold=True)
    for path, count in sorted(Counter(r.nodeid.split("::")[0] for r in skipped).items()):
        terminalreporter.write_line(f"{path}: {count} test{'s' if count > 1 else ''}")
    count = len(skipped)
    terminalreporter.write_line(
        f"{count} test{'s' if count > 1 else ''} that need{'' if count > 1 else 's'} root did not run: "
        "run the suite as root to run them"
    )
