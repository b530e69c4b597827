"""A submission's budgets, as its worker's client spends them.

The whole submission has one budget of wall time (`submission_seconds`) and one of CPU time
(`submission_cpu_seconds`, every process the worker started, across restarts) across every request, restart and
check; once either is spent, the request running is stopped and every later one fails at once, saying so. Each
untimed request that runs only the student's code also has a CPU deadline that follows the reference's CPU for the
same request (`RequestCpu`), besides its wall deadline (`errors.Deadline`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from autograder.sandbox.errors import BudgetSpent, CheckBudget, Deadline, WorkerTimeout
from autograder.sandbox.settings import WorkerConfig

BUDGET_LOOK_SECONDS = 0.1  # the CPU budget is looked at no more often than this (`Budgets.cpu_used`)


# The requests whose CPU time is bounded (`RequestCpu`): those that run only what the student wrote. The others
# keep their wall deadline alone: building or moving a module may start CUDA, a capture's first call imports
# torch's compiler, and a timed request has its own deadline.
CPU_BOUNDED_OPS = frozenset({"forward", "call", "get", "describe", "stand_in"})


@dataclass(frozen=True)
class RequestCpu:
    """The CPU deadline of one untimed request: it is stopped once the worker's processes have used `limit` CPU
    seconds since `start` (their CPU time when it was sent). The limit follows the reference: `factor` times the
    reference's CPU for the same request, never below the floor, never above the request's wall deadline."""

    limit: float
    why: str
    start: float = 0.0

    @classmethod
    def of(cls, config: WorkerConfig, op: str, reference_cpu: float | None, wall: float) -> RequestCpu | None:
        """The CPU deadline `config` gives a request of `op` with a wall deadline of `wall` seconds, whose
        reference took `reference_cpu` CPU seconds (None: not known, the floor), from a start still to be set;
        None where there is none."""
        floor = config.request_floor_seconds
        if floor is None or op not in CPU_BOUNDED_OPS:
            return None
        scaled = config.request_factor * reference_cpu if reference_cpu is not None else 0.0
        if scaled > floor:
            limit, why = scaled, f"{config.request_factor:g} times what the reference's code needs for it"
        else:
            limit, why = floor, "what any request gets"
        return cls(limit, why) if limit < wall else None

    def check(self, used: float, what: str, hint: str) -> None:
        """Raise WorkerTimeout once the request has used its CPU time (`used`: the worker's CPU time now)."""
        if used - self.start > self.limit:
            raise WorkerTimeout(f"{what} did not finish within {self.limit:.3g} s of CPU time, {self.why} ({hint})")


class Budgets:
    """One submission's budgets: wall time until `end` (on `time.monotonic()`'s clock; what its requests waited for
    other gradings' timing moves it), CPU time of all its workers (`spent`: those already ended; `cpu_now()`: the
    running one's, whose identity `running()` gives), and the CPU deadline of the request under way (`request`)."""

    def __init__(self, config: WorkerConfig, running: Callable[[], object], cpu_now: Callable[[], float]):
        self.config, self.running, self.cpu_now = config, running, cpu_now
        self.end = time.monotonic() + config.submission_seconds
        self.spent = 0.0  # CPU seconds of workers already ended
        self._look: tuple[object, float, float] | None = None  # (process, when, used)
        self._request: tuple[RequestCpu, str] | None = None  # the request under way's CPU deadline, and hint

    def cpu_used(self, fresh: bool = False) -> float:
        """CPU seconds of the submission's workers so far, ended ones included, looked at at most every
        `BUDGET_LOOK_SECONDS` of one process (unless `fresh`): without a control group each look walks /proc
        (every process of the machine, a few milliseconds where there are hundreds), and a reply is read in
        several chunks, each charged. Between two looks the worker can spend at most that long times its cores
        beyond a limit."""
        now, process = time.monotonic(), self.running()
        last = self._look
        if not fresh and last is not None and last[0] is process and now - last[1] < BUDGET_LOOK_SECONDS:
            return last[2]
        used = self.spent + self.cpu_now()
        self._look = (process, now, used)
        return used

    def cpu_left(self) -> bool:
        """Whether the submission's CPU budget is not spent yet (never looked at when there is none)."""
        limit = self.config.submission_cpu_seconds
        return limit is None or self.cpu_used() < limit

    def charge(self, what: str) -> None:
        """Raise BudgetSpent once the submission's CPU budget is spent, and WorkerTimeout once the request under way
        has used its own CPU time (`RequestCpu`)."""
        if not self.cpu_left():
            raise BudgetSpent(
                f"{what} was stopped: the CPU time budget for the whole submission "
                f"({self.config.submission_cpu_seconds:g} CPU seconds) is used up"
            )
        if self._request is not None:
            deadline, hint = self._request
            deadline.check(self.cpu_used(), what, hint)

    def refuse_spent(self, what: str) -> None:
        """Before a request is sent: raise BudgetSpent when either budget of the whole submission is spent."""
        if time.monotonic() >= self.end:
            raise BudgetSpent(
                f"{what} was not run: the time budget for the whole submission "
                f"({self.config.submission_seconds:g} s) is used up"
            )
        if not self.cpu_left():
            raise BudgetSpent(
                f"{what} was not run: the CPU time budget for the whole submission "
                f"({self.config.submission_cpu_seconds:g} CPU seconds, all its processes together) "
                "is used up"
            )

    def deadline(self, seconds: float, hint: str = "an infinite loop?", check: CheckBudget | None = None) -> Deadline:
        """A deadline `seconds` from now, or at the end of the submission's budget or of `check`'s."""
        return Deadline.within(seconds, self.end, hint, check)

    @contextlib.contextmanager
    def request(self, cpu: RequestCpu | None, hint: str) -> Iterator[None]:
        """While one request is under way: its CPU deadline `cpu` (if any) counts from the CPU used now."""
        self._request = (replace(cpu, start=self.cpu_used(fresh=True)), hint) if cpu is not None else None
        try:
            yield
        finally:
            self._request = None
