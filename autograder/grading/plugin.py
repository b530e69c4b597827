"""A pytest plugin that records each check's outcome; no grading logic lives here.

Markers: `@pytest.mark.part("mha")` (required on every check) and `@pytest.mark.evidence("worker")`
for a check that rests on what the worker reports about itself (hooks, a trace). A check that earns part
of its points (the speed part) says how much with `request.node.user_properties.append(("credit", f))`,
f between 0 and 1, before it fails. Which checks exist is
the checks' business, how outcomes become points is `scoring.score`'s.

Only a check's own failure (`harness.fail`, i.e. `pytest.fail`, or `NotCredited`) counts against the
submission. Any other exception in a check, in its setup or teardown, or pytest-timeout stopping a check,
is the grader's fault: it is recorded in `grader_errors`, and the run cannot grade.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_timeout import PYTEST_FAILURE_MESSAGE  # type: ignore[import-untyped]  # pytest-timeout ships no types

from autograder.grading.devices import TimingLockError
from autograder.grading.scoring import Outcome
from autograder.grading.workers import CannotTime
from autograder.model import FAILED, GRADER, NOT_CHARGED, NOT_CREDITED, PASSED, TIMING_LOCK, WORKER
from autograder.rubric import Rubric, RubricError

CREDIT = "credit"  # the user property naming the fraction of its points a check earned


def stopped_by_pytest_timeout(message: str) -> bool:
    """Whether a check's failure is pytest-timeout stopping it: its whole message is the plugin's own
    (`PYTEST_FAILURE_MESSAGE`, the limit in seconds where it says %s); no message of a check's own is that."""
    head, _, tail = PYTEST_FAILURE_MESSAGE.partition("%s")
    seconds = message.removeprefix(head).removesuffix(tail)
    if not (message.startswith(head) and message.endswith(tail)) or len(seconds) == len(message):
        return False
    try:
        float(seconds)
    except ValueError:
        return False
    return True


def check_key(item: pytest.Item) -> str:
    """The rubric's key for a check: "<module without test_>::<function>", e.g. "mha::test_values"."""
    module = Path(str(item.fspath)).stem.removeprefix("test_")
    return f"{module}::{_function_name(item)}"


def _function_name(item: pytest.Item) -> str:
    """The check function's name, without its parameters' ids."""
    name: str = getattr(item, "originalname", item.name)
    return name


class NotCredited(pytest.fail.Exception):  # type: ignore[name-defined,misc]  # pytest's Failed
    """A check that earns nothing because something it rests on is wrong, and accuses nothing of its own:
    a property of a wrong output, speed before the values are right. With a `cause` (a problem many checks
    share, such as a constructor the grader cannot load weights into), the first check in the results that
    meets it fails with the whole message and the others are not credited, pointing to it
    (`scoring.name_once`). `owner`: the part whose mistake the cause is (`contract.PART_OF_NAME`); the checks of
    another part that meet it are not charged (`NotCharged`): one mistake, one part."""

    def __init__(self, message: str, cause: str = "", owner: str = ""):
        super().__init__(message, pytrace=False)
        self.cause = cause
        self.owner = owner


class NotCharged(NotCredited):
    """A check that cannot be judged because of a mistake in another part, charged there once (a stand-in
    that gives values only, through which no gradient flows): it earns its points, and says that it waits for
    that part. The speed part is never not charged (the rubric's declared rule: `scoring.gate_speed`)."""


class CheckFailed(pytest.fail.Exception):  # type: ignore[name-defined,misc]  # pytest's Failed
    """A check's own failure (`harness.fail`), with the likely mistake it names (`mistake`, in words the same
    for every student who made it; empty when it names none), which the class report counts, and what went
    wrong (`diagnosis`: the same for every case that meets it, whatever its message says of the case; empty
    when the failure is its own), by which `scoring` says each diagnosis once; and what the message says before
    it explains the likely mistake (`detail`, `harness.Failure`'s), which its row keeps where that explanation
    is said elsewhere (`scoring.say_once`)."""

    def __init__(self, message: str, mistake: str = "", diagnosis: str = "", detail: str = ""):
        super().__init__(message, pytrace=False)
        self.mistake = mistake
        self.diagnosis = diagnosis
        self.detail = detail


class SharedProblem(pytest.fail.Exception):  # type: ignore[name-defined,misc]  # pytest's Failed
    """A failure that many checks meet for one reason (`cause`: a name left undefined by a cell with a syntax
    error): the first check in the results says it in full, the others are not credited and point to it
    (`scoring.name_once`). Unlike `NotCredited`, a check may catch it (`harness.attempt`) and go on. Its
    `mistake` is the cause in words the same for every student (`CheckFailed`'s)."""

    def __init__(self, message: str, cause: str, mistake: str = "", owner: str = ""):
        super().__init__(message, pytrace=False)
        self.cause = cause
        self.mistake = mistake
        self.diagnosis = cause
        self.owner = owner  # the part whose mistake it is (`NotCredited`'s)


@dataclass(frozen=True)
class GraderError:
    """A failure of the grader's own: what it said, and why by name when it says (`workers.CannotTime.cause`,
    `model.TIMING_LOCK`; else "")."""

    said: str
    cause: str = ""


MESSAGE_CHARS = 2500  # one check's message in results.json: every check failing at once stays small


def _bounded(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    return message[:MESSAGE_CHARS] + f"... [{len(message) - MESSAGE_CHARS:,} more characters]"


class ResultsPlugin:
    def __init__(
        self,
        rubric: Rubric,
        visible_only: bool,
        parts: tuple[str, ...] | None = None,
        checks: tuple[str, ...] | None = None,
    ):
        self.rubric, self.visible_only = rubric, visible_only
        self.parts = parts  # only these parts' checks run (None: every part)
        self.checks = checks  # only these checks run: "module::function", or with one case "...[case]" (None: all)
        self.outcomes: dict[str, Outcome] = {}
        self.errors: list[GraderError] = []  # the grader's own failures, in the order they happened

    @property
    def grader_errors(self) -> list[str]:
        """What each of the grader's own failures said."""
        return [error.said for error in self.errors]

    def error(self, said: str, cause: str = "", first: bool = False) -> None:
        """Record a failure of the grader's own (never the student's), with why by name when it says
        (`model.GradingRun.cannot_grade_cause`); `first`: before the others (what stopped the run)."""
        self.errors.insert(0 if first else len(self.errors), GraderError(said, cause))

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", "part(id): the rubric part a check belongs to")
        config.addinivalue_line("markers", "evidence(who): 'worker' when a check rests on what the worker reports")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.error(f"the check module {report.nodeid} could not be collected:\n{report.longreprtext[-2000:]}")

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.grader_errors:
            try:
                self.rubric.check_test_keys({check_key(i) for i in items})
            except RubricError as exc:
                self.error(str(exc))
        keep = [
            i
            for i in items
            if (not self.visible_only or self.rubric.visibility(check_key(i)) == "visible")
            and (self.parts is None or part_of(i) in self.parts)
            and (self.checks is None or selected(i, self.checks))
        ]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
        for item in items:
            part = part_of(item)
            if part not in self.rubric.parts:
                self.error(f"{item.nodeid}: no @pytest.mark.part(...) naming a part of the rubric")
                continue
            evidence = item.get_closest_marker("evidence")
            function = getattr(item, "function", None)
            doc = (getattr(function, "__doc__", None) or _function_name(item)).strip().splitlines()[0]
            param = getattr(item, "callspec", None)
            self.outcomes[item.nodeid] = Outcome(
                key=check_key(item),
                part=part,
                name=doc,
                evidence=WORKER if evidence and evidence.args[0] == WORKER else GRADER,
                case=param.id if param else "",
            )
        if self.grader_errors:
            items[:] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
        yield
        outcome = self.outcomes.get(item.nodeid)
        if outcome is None:
            return
        if call.when == "call":
            credits = [value for name, value in item.user_properties if name == CREDIT]
            if credits and isinstance(credits[-1], (int, float)):
                outcome.credit = min(1.0, max(0.0, float(credits[-1])))
            elif credits:
                self.error(f"{item.nodeid}: a credit that is not a number: {credits[-1]!r:.100}")
        excinfo = call.excinfo
        if excinfo is None:
            if call.when == "call" and outcome.status is None:
                outcome.status = PASSED
            return
        error = excinfo.value
        if isinstance(error, pytest.fail.Exception) and not stopped_by_pytest_timeout(str(error.msg)):
            cause = getattr(error, "cause", "")
            if isinstance(error, NotCharged) and not cause:
                outcome.status = NOT_CHARGED
            else:
                outcome.status = NOT_CREDITED if isinstance(error, NotCredited) and not cause else FAILED
            outcome.cause = cause
            outcome.owner = getattr(error, "owner", "") if cause else ""
            outcome.mistake = outcome.mistake or getattr(error, "mistake", "")
            if not outcome.message:
                outcome.message = _bounded(str(error.msg))
                outcome.diagnosis = getattr(error, "diagnosis", "") or cause
                detail = getattr(error, "detail", "")
                outcome.detail = detail if len(detail) <= MESSAGE_CHARS else ""  # one the bounded message holds whole
            return
        # anything else is the grader's own trouble, never the student's
        outcome.status = FAILED
        where = f"{item.nodeid} ({call.when})"
        text = str(excinfo.getrepr(style="short", chain=False))[-3000:]
        said = f"{where}: {excinfo.typename}: {str(error)[:500]}\n{text}"
        if isinstance(error, CannotTime) and error.cause:
            self.error(said, error.cause)
        elif isinstance(error, TimingLockError):  # the submission's request waited too long for others' timing
            self.error(said, TIMING_LOCK)
        else:
            self.error(said)


def selected(item: pytest.Item, checks: tuple[str, ...]) -> bool:
    """Whether a check, or this case of it, is one of `checks` ("module::function" or "module::function[case]")."""
    key, param = check_key(item), getattr(item, "callspec", None)
    return key in checks or (param is not None and f"{key}[{param.id}]" in checks)


def part_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("part")
    part: str | None = marker.args[0] if marker and marker.args else None
    return part
