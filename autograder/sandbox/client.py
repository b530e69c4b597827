"""Trusted side: the grader's handle on one submission's worker, the front its requests go through.

`Worker` sends requests and reads replies with deadlines over the running process's `channel.Channel`; its
lifecycle (start, load, restarts, quiet turns: `lifecycle`) and budgets (`budgets`) are units of their own. Every
reply is read within its deadline and checked against the protocol's schema; the one failure policy
(`lifecycle.RestartPolicy`) decides what a timeout or crash means for later requests.

Deadlines: each request has its own (`request_seconds`, and a CPU deadline that follows the reference's,
`budgets.RequestCpu`), and the whole submission has one budget of wall time and one of CPU time
(`budgets.Budgets`). A caller may also give a request a `CheckBudget` (what is left of one check's time): the
request, and a restart of the worker it needs, end by then at the latest, so that no submission can make a check
outlast its budget by making its worker restart slowly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from autograder.sandbox import protocol
from autograder.sandbox.budgets import RequestCpu
from autograder.sandbox.channel import Channel, OutputCapture, describe_exit, ended_while
from autograder.sandbox.errors import (
    BudgetSpent,
    CheckBudget,
    CheckTimeUp,
    Deadline,
    EndedBeforeRequest,
    LoadFailed,
    SubmissionError,
    WorkerCannotStart,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
)
from autograder.sandbox.lifecycle import FINAL, Lifecycle, Quiet, RestartPolicy, WireCell, WorkerLifecycle
from autograder.sandbox.protocol import Asks, ForwardManyRequest, ShowOutputs, TimedCall, V
from autograder.sandbox.settings import WorkerConfig

# what callers import from here (the worker's front), wherever it is defined
__all__ = [
    "FINAL",
    "BudgetSpent",
    "Channel",
    "CheckBudget",
    "CheckTimeUp",
    "Deadline",
    "EndedBeforeRequest",
    "Lifecycle",
    "LoadFailed",
    "OutputCapture",
    "Quiet",
    "RequestCpu",
    "RestartPolicy",
    "SubmissionError",
    "TimedCalls",
    "WireCell",
    "Worker",
    "WorkerCannotStart",
    "WorkerConfig",
    "WorkerCrashed",
    "WorkerError",
    "WorkerTimeout",
    "describe_exit",
    "ended_while",
]


class Worker(WorkerLifecycle):
    """One submission's worker, as its requests see it: each is sent over the running process's `Channel` once
    the worker is (re)started for it (`lifecycle.WorkerLifecycle`), within its deadlines (`budgets.Budgets`); a
    timeout or crash goes through the one `RestartPolicy`."""

    # -- requests
    def known_to_hang(self) -> bool:
        """Whether this submission has hung already: a cell stopped while its file loaded, or an untimed
        request stopped at its deadline."""
        return bool(self.skipped_cells) or self.policy.stopped_request

    def request_limit(self, op: str = "forward") -> float:
        """The deadline of one untimed request: `request_seconds`, or `hung_request_seconds` once the
        submission is known to hang (a forward of the checks' inputs takes milliseconds, so a file that
        hung once is not waited for as long again). Building a module is exempt: it may start CUDA."""
        shorter = self.config.hung_request_seconds
        if shorter is not None and op != "build" and self.known_to_hang():
            return min(shorter, self.config.request_seconds)
        return self.config.request_seconds

    def request(
        self,
        request: Asks[V],
        timeout: float | None = None,
        target: str | None = None,
        overrun_hint: str = "an infinite loop?",
        timed: bool = False,
        check: CheckBudget | None = None,
        reference_cpu: float | None = None,
    ) -> V:
        """Send one request and return its decoded value (the type it asks for, `protocol.Asks`). Raises SubmissionError when the student's code
        raised, WorkerTimeout / WorkerCrashed when the worker had to be killed (it is restarted next
        time), LoadFailed when the file cannot be loaded at all. A `timed` request (the speed part's) has
        its own deadline, and running past it does not make the submission known to hang. With `check`, the
        request, and a restart of the worker it needs, end when the check's budget does. An untimed request
        that runs the student's code also has a CPU deadline (`RequestCpu`) that follows `reference_cpu`, the
        CPU seconds the reference's code took for the same request (None: not known). In its turn (`_turn`),
        once a worker that must be (re)started has started (Python and torch are not the submission's code)."""
        since = self.quiet_waited
        self._ready_for(request.op, target, check)  # a load it needs waits in a turn of its own
        with self._turn(self._moved(check, since)) as check:
            return self._request(request, timeout, target, overrun_hint, timed, check, reference_cpu)

    def _request(
        self,
        request: Asks[V],
        timeout: float | None,
        target: str | None,
        overrun_hint: str,
        timed: bool,
        check: CheckBudget | None,
        reference_cpu: float | None = None,
    ) -> V:
        op = request.op
        self._ready_for(op, target, check)
        if timed:
            timeout = timeout or self.config.request_seconds
        else:
            limit = self.request_limit(op)
            timeout = min(timeout, limit) if timeout else limit
            if limit < self.config.request_seconds:
                overrun_hint += (
                    f"; your file hung before, so a request now gets {limit:g} s, not {self.config.request_seconds:g}"
                )
        what = target or op
        cpu = None if timed else RequestCpu.of(self.config, op, reference_cpu, timeout)
        try:
            with self.budgets.request(cpu, overrun_hint):
                reply = self._channel(what).exchange(request, self._deadline(timeout, overrun_hint, check), what)
        except EndedBeforeRequest:  # it ended before reading this request: restarted for it, or given up on
            self._ended_on_its_own()
            return self._request(request, timeout, target, overrun_hint, timed, check, reference_cpu)
        except (WorkerTimeout, WorkerCrashed) as exc:
            self.failed(exc, target, timed)
            raise
        if reply.error is not None:  # not ok: the student's code raised
            raise SubmissionError(reply.error)
        return cast(V, reply.value)  # ok: the value REPLIES[op] made, of the type the request asks for

    def failed(self, exc: WorkerError, target: str | None, timed: bool) -> None:
        """The one failure policy of every request, untimed or timed: a timeout or crash is remembered
        (`RestartPolicy.failed`) and said, and the worker killed (the next request starts a new one)."""
        self.policy.failed(exc, target, timed)
        self.events.append(str(exc))
        self.kill()

    def _ready_for(self, op: str, target: str | None, check: CheckBudget | None) -> None:
        """Before a request is sent: refuse it when a budget is spent or its target is known to hang or
        crash, and start the worker (again) when it is not running."""
        self.budgets.refuse_spent(target or op)
        self.policy.refuse(target)
        if self.state is Lifecycle.RUNNING and self.process is not None and not self.process.alive():
            self._ended_on_its_own()
        self._refuse_if_final()
        if not self.alive():
            self.start(check)

    def timed_calls(
        self,
        request: ForwardManyRequest,
        timeout: float,
        target: str | None = None,
        check: CheckBudget | None = None,
        ready_seconds: float = 1.0,
    ) -> TimedCalls:
        """A `forward_many` request for its `calls` timed forwards, not sent yet: the worker is (re)started here
        when it must be, outside any clock. The caller's clock then runs from `TimedCalls.open()` (the
        settings out, the worker's ready back within `ready_seconds`: the worker's whole time between the
        request and its first call is timed and bounded) through one `call(seed)` per call; `finish(show)`,
        outside the clock, ends the request. Raises as `request` does. A worker with a `quiet` lock runs its
        timed calls only while a measurement holds it (`timing.Stage`): outside its turns it is stopped."""
        what, since = f"{target} (timed)" if target else "forward_many", self.quiet_waited
        self._ready_for("forward_many", what, check)
        check = self._moved(check, since)
        deadline = self._deadline(timeout, "far slower than the reference's forward, whose time sets this limit", check)
        return TimedCalls(self, request, deadline, what, ready_seconds)

    def forward_many(
        self, request: ForwardManyRequest, seeds: list[int], timeout: float | None = None, show: list[int] | None = None
    ) -> tuple[list[Any], protocol.TimedShown]:
        """Every seed's timed forward in one `forward_many` request (its `calls`: one per seed), and what it shows
        after (the outputs of the calls in `show`, every call's record); untimed here: for tests and tools."""
        request = replace(request, calls=len(seeds))
        calls = self.timed_calls(request, timeout or self.config.request_seconds)
        calls.open()
        answers = [calls.call(seed) for seed in seeds]
        return answers, calls.finish(show or [])


class TimedCalls:
    """One timed `forward_many` request: `open()` sends its settings and waits for the worker's ready (within
    `ready_seconds`), `call(seed)` sends one call's seed and returns its answer; both are the only work inside
    the caller's clock, and the same code for every worker, the reference's and the submission's alike: one
    small frame out, one reply in, within the request's deadline, and no grader work besides. `finish(show)`,
    after the clock, asks for the whole outputs of the calls in `show` (chosen only then) and every call's
    record, and charges the CPU budget. The worker learns a call's seed only when the call starts, so no call
    can be batched with or prepared for a later one. A failure ends the calls and goes through the worker's
    one failure policy (`Worker.failed`), as a timed request's."""

    def __init__(
        self, worker: Worker, request: ForwardManyRequest, deadline: Deadline, what: str, ready_seconds: float
    ):
        self.worker, self.request, self.deadline, self.what = worker, request, deadline, what
        self.calls = self.left = request.calls
        self.ready_seconds = ready_seconds
        self.opened = False

    def open(self) -> None:
        frame = self.worker._channel(self.what).frame(self.request)
        ready = Deadline.within(
            min(self.ready_seconds, self.deadline.left()),
            self.worker.budget_end,
            "each timed call's input comes only with the call, so there is nothing to prepare before them",
        )
        self.opened = True
        self._exchange(frame, self.request.op, ready, f"{self.what}, getting ready for its calls")

    def call(self, seed: int) -> Any:
        if not self.opened or self.left <= 0:
            raise ValueError("a timed call outside an open request's calls")
        self.left -= 1
        return self._exchange(
            protocol.pack_frame(protocol.field_values(TimedCall(seed)), []), "forward_call", self.deadline
        )

    def finish(self, show: list[int]) -> protocol.TimedShown:
        """After the last call, outside every clock: the whole outputs of the calls in `show` and every
        call's record; then the submission's CPU budget is charged."""
        if self.left:
            raise ValueError(f"{self.left} timed calls were not made")
        header = protocol.field_values(ShowOutputs(list(show)))
        shown = self._exchange(protocol.pack_frame(header, []), "forward_shown", self.deadline)
        if not isinstance(shown, protocol.TimedShown) or len(shown.outputs) != len(show):
            self.worker.kill()
            raise WorkerCrashed(f"the worker's answer while {self.what} did not hold the outputs asked for")
        try:
            self.worker.budgets.charge(self.what)
        except BudgetSpent:
            self.worker.kill()
            raise
        return shown

    def _exchange(self, frame: bytes, op: str, deadline: Deadline, what: str | None = None) -> Any:
        worker, what = self.worker, what or self.what
        try:
            channel = worker._channel(what)
            channel.send(frame, deadline, what)
            reply = channel.receive(op, deadline, what, charge=False)
        except (WorkerTimeout, WorkerCrashed) as exc:
            worker.failed(exc, what, timed=True)
            raise
        if reply.error is not None:  # the student's code raised: the worker ended the calls
            self.left = 0
            raise SubmissionError(reply.error)
        return reply.value
