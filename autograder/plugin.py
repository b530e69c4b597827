"""A pytest plugin that records each check's outcome and, at the end, turns them into results.json.

No grading logic lives here: which tests exist is the checks' business, how outcomes become points
is `scoring.build_results`'s. The grading run adds what only it knows (the time taken, what the
submission printed) and writes the file with `write_json_atomically`, after the worker is gone.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from autograder.rubric import Rubric
from autograder.scoring import Outcome, build_results


def check_key(item: pytest.Item) -> str:
    """The rubric's key for a check: "<module without test_>::<function>", e.g. "mha::test_values"."""
    module = Path(str(item.fspath)).stem.removeprefix("test_")
    return f"{module}::{item.originalname}"


def check_part(item: pytest.Item) -> str:
    marker = item.get_closest_marker("part")
    if marker is None:
        raise pytest.UsageError(f"{item.nodeid} has no @pytest.mark.part(...)")
    return marker.args[0]


class ResultsPlugin:
    def __init__(self, rubric: Rubric, visible_only: bool, meta: dict):
        self.rubric, self.visible_only, self.meta = rubric, visible_only, meta
        self.outcomes: dict[str, Outcome] = {}
        self.results: dict | None = None

    def pytest_configure(self, config):
        config.addinivalue_line("markers", "part(id): the rubric part a check belongs to")

    def pytest_collection_modifyitems(self, config, items):
        keep = [i for i in items if not self.visible_only or self.rubric.visibility(check_key(i)) == "visible"]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
        for item in items:
            key = check_key(item)
            doc = (item.function.__doc__ or item.originalname).strip().splitlines()[0]
            param = getattr(item, "callspec", None)
            name = f"{doc} [{param.id}]" if param else doc
            self.outcomes[item.nodeid] = Outcome(key=key, part=check_part(item), name=name)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        outcome = self.outcomes.get(report.nodeid)
        if outcome is None:
            return
        if report.failed:
            outcome.status = "failed"
            outcome.message = outcome.message or failure_message(report)
        elif report.when == "call" and report.passed and outcome.status is None:
            outcome.status = "passed"
        elif report.skipped and outcome.status is None:
            outcome.status = "failed"
            outcome.message = "not run: " + str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)

    def pytest_sessionfinish(self, session):
        self.results = build_results(list(self.outcomes.values()), self.rubric, self.meta)


def failure_message(report) -> str:
    longrepr = report.longrepr
    if hasattr(longrepr, "reprcrash") and longrepr.reprcrash is not None:
        message = longrepr.reprcrash.message
        return message.removeprefix("Failed: ")
    return str(longrepr)[-2000:]


def write_json_atomically(path: Path, data: dict):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    os.fchmod(fd, 0o644)  # mkstemp makes it private; results are read by feedback tools and LMS uploads
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)
