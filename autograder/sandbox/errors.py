"""The ways a request to a worker can fail, as the grader's side raises them, and the deadlines that end one.

Whose fault each is: a `SubmissionError` is the student's code raising; a `WorkerTimeout`, `WorkerCrashed` or
`LoadFailed` is the submission's (its code hung, ended the worker, or could not be loaded); a
`WorkerCannotStart` is the grader's environment's (no code of the submission had run). A `BudgetSpent` is a
`WorkerTimeout` of the whole submission's budget, a `CheckTimeUp` the end of one check's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autograder.sandbox.protocol import StudentError


class WorkerError(Exception):
    """A request could not be answered; the message is meant for the student."""


class SubmissionError(WorkerError):
    """The student's code raised an exception while answering."""

    def __init__(self, error: StudentError):
        self.type, self.message, self.traceback = error.type, error.message, error.traceback
        super().__init__(f"{self.type}: {self.message}")


class WorkerTimeout(WorkerError):
    pass


class WorkerCrashed(WorkerError):
    pass


class LoadFailed(WorkerError):
    pass


class BudgetSpent(WorkerTimeout):
    """The submission's whole time budget is used up."""


class EndedBeforeRequest(WorkerCrashed):
    """The worker ended before it had read the request (on its own, between requests): the request is not
    what ended it."""


class CheckTimeUp(WorkerTimeout):
    """A check's budget ended what was running (see `CheckBudget`)."""


class WorkerCannotStart(WorkerError):
    """The worker could not start Python and torch before any of the submission's code ran: the grader's
    environment is at fault (a broken installation, a missing CUDA device), never the submission."""


@dataclass(frozen=True)
class CheckBudget:
    """What one check of the grader has left for all its requests, a restart of the worker included: it
    ends at `end` (on `time.monotonic()`'s clock); `seconds` is the check's whole budget."""

    end: float
    seconds: float


@dataclass(frozen=True)
class Deadline:
    """When one request must be answered by (`end`, on `time.monotonic()`'s clock): `seconds` is what it
    stands for; `by_budget` says the submission's whole time budget ends first, and then is what limits
    it; `by_check` is set when a check's budget ends first (and then is what limits it); `hint` is what to
    suggest to the student when it is overrun."""

    end: float
    seconds: float
    by_budget: bool
    hint: str = "an infinite loop?"
    by_check: CheckBudget | None = None

    @classmethod
    def within(
        cls, seconds: float, budget_end: float, hint: str = "an infinite loop?", check: CheckBudget | None = None
    ) -> Deadline:
        """A deadline `seconds` from now, or at the submission's budget's end or the check's, whichever
        comes first."""
        now = time.monotonic()
        end = min(now + seconds, budget_end, check.end if check is not None else math.inf)
        if end == now + seconds:
            return cls(end, seconds, False, hint)
        if end == budget_end:
            return cls(end, seconds, True, hint)
        return cls(end, seconds, False, hint, check)

    def left(self) -> float:
        """Seconds left, never below zero."""
        return max(0.0, self.end - time.monotonic())

    def check(self, what: str, why: str | None = None) -> None:
        """Raise once the deadline has passed: BudgetSpent when the submission's budget is what ended it,
        else WorkerTimeout, saying `what` did not finish and `why` (else the deadline's hint)."""
        if time.monotonic() < self.end:
            return
        if self.by_budget:
            raise BudgetSpent(f"{what} was stopped: the time budget for the whole submission is used up")
        if self.by_check is not None:
            raise CheckTimeUp(f"{what} was stopped: this check used up its time budget ({self.by_check.seconds:g} s)")
        raise WorkerTimeout(f"{what} did not finish within {self.seconds:g} s ({why or self.hint})")
