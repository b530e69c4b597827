"""Trusted side: the grader's handle on one submission's worker.

`Worker` starts the worker (through `launcher`), loads the submission, sends requests and reads
replies with deadlines, and kills and replaces the worker after a hang or a crash. Every reply is
read within its deadline, bounded by `protocol.FrameLimits` before anything is materialised, and checked
against the protocol's schema; a reply that breaks it is the worker's fault (`WorkerCrashed`).
Nothing from the worker is ever unpickled.

Budgets: each request has its own deadline (`request_seconds`), and the whole submission has one
budget of wall time (`submission_seconds`) and one of CPU time (`submission_cpu_seconds`, every process
the worker started, across restarts) across every request, restart and check; once either is spent,
the request running is stopped and every later one fails at once, saying so. A caller may also give a
request a `CheckBudget` (what is left of one check's time): the request, and a restart of the worker it
needs, end by then at the latest, so that no submission can make a check outlast its budget by making its
worker restart slowly.

Quiet timing: a worker given a `quiet` lock (a submission's: `devices.QuietLock`) runs only during its own
requests. Each request, and each start that loads the file, holds the lock shared (no other grading's timing
runs meanwhile) and continues the worker's processes; afterwards every one of them is stopped again, so
nothing the submission left running (a thread, a daemon) runs while another grading times. The time a
request waited for the lock moves its deadlines, the submission's budget's and the check's: it is not the
submission's.

Whose fault: a worker that cannot start Python and torch, before any of the submission's code has run,
is the grader's environment's (`WorkerCannotStart`, the run cannot grade); everything after that is the
submission's. A worker that ends on its own between requests (the submission's code exited it) is
restarted, at most `crashes_before_giving_up` times.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import math
import os
import select
import signal
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import IO, Any, Protocol, TypeVar

from autograder.sandbox import bwrap, launcher, probe, protocol
from autograder.sandbox.protocol import (
    Asks,
    ForwardManyRequest,
    Loaded,
    LoadRequest,
    ProtocolError,
    Ready,
    ShowOutputs,
    StudentError,
    TimedCall,
)
from autograder.sandbox.settings import WorkerConfig

V = TypeVar("V")  # what a request asks for (`protocol.Asks`)


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


class OutputCapture(threading.Thread):
    """Drains the worker's stdout/stderr so a flood cannot block it; keeps the first `limit` bytes."""

    def __init__(self, stream: IO[bytes], limit: int):
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.head = bytearray()
        self.total = 0

    def run(self) -> None:
        while chunk := os.read(self.stream.fileno(), 1 << 16):
            self.total += len(chunk)
            room = self.limit - len(self.head)
            if room > 0:
                self.head += chunk[:room]

    def text(self) -> str:
        text = protocol.clean_text(self.head.decode("utf-8", errors="replace"), self.limit)
        if self.total > len(self.head):
            text += f"\n... [{self.total - len(self.head):,} more bytes of output not kept]"
        return text


# Cells as they cross the wire: [number, first line in the file, source]
WireCell = tuple[int, int, str]


class Lifecycle(enum.Enum):
    """Where a `Worker` stands. Its process exists in PRESTARTED, STARTING and RUNNING only; the last three
    are final (`Worker.why` says why), and every later request fails at once, saying so."""

    IDLE = "no process"  # none yet, or the last one ended: the next request starts one
    PRESTARTED = "prestarted"  # started early (`prestart`): Python and torch load; nothing of the file yet
    STARTING = "starting"  # waiting for its `ready`, then loading the file
    RUNNING = "running"  # it said ready and loaded the file: requests go to it
    CANNOT_START = "cannot start"  # the first process could not start Python and torch: the grader's fault
    LOAD_FAILED = "load failed"  # the file failed, hung or crashed while loading: not loaded again
    GIVEN_UP = "given up"  # it ended between requests `crashes_before_giving_up` times: not restarted again


FINAL = (Lifecycle.CANNOT_START, Lifecycle.LOAD_FAILED, Lifecycle.GIVEN_UP)
BUDGET_LOOK_SECONDS = 0.1  # the CPU budget is looked at no more often than this (`Worker._cpu_used`)
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


@dataclass
class RestartPolicy:
    """What the failures of a submission's requests so far decide, the same for untimed and timed requests:
    a target that hung is not tried again, nor one that ended the worker `tries` times; a worker that ended
    on its own between requests `tries` times is not restarted again; a submission known to hang gets the
    shorter deadline (`Worker.request_limit`)."""

    tries: int
    hung: dict[str, str] = field(default_factory=dict)  # target -> message, for targets that timed out once
    crashes: dict[str, list[str]] = field(default_factory=dict)  # target -> messages, each time it ended the worker
    ended_between: list[str] = field(default_factory=list)  # how the worker ended on its own between requests
    stopped_request: bool = False  # an untimed request was stopped at its deadline

    def refuse(self, target: str | None) -> None:
        """Raise for a target that is not tried again."""
        if target and target in self.hung:
            raise WorkerTimeout(self.hung[target])
        if target and len(self.crashes.get(target, ())) >= self.tries:
            raise WorkerCrashed(
                f"{self.crashes[target][-1]} (this happened {self.tries} times; not tried again in later checks)"
            )

    def failed(self, exc: WorkerError, target: str | None, timed: bool) -> None:
        """Remember a request's timeout or crash (the caller kills the worker). A spent budget is nobody's hang;
        a timed request running past its deadline does not make the submission known to hang."""
        if isinstance(exc, WorkerTimeout):
            if not isinstance(exc, BudgetSpent):
                self.stopped_request = self.stopped_request or not timed
                if target:
                    self.hung[target] = f"{exc} (not tried again in later checks)"
        elif target:
            self.crashes.setdefault(target, []).append(str(exc))

    def ended(self, how: str) -> str | None:
        """The worker ended on its own between requests: why it is not restarted again, once that has happened
        `tries` times."""
        self.ended_between.append(how)
        times = len(self.ended_between)
        if times >= self.tries:
            return f"{how} (this happened {times} times; the worker is not restarted again)"
        return None


class Channel:
    """The frames between the grader and one worker process: a request written, its reply read and checked, each
    within a deadline, and the CPU budget checked while it is read where the caller charges it (`budget`, which
    raises BudgetSpent). Knows nothing of restarts: a failure is raised for the `Worker` to handle."""

    def __init__(
        self,
        process: launcher.WorkerProcess,
        limits: protocol.FrameLimits,
        codec: protocol.TensorCodec,
        memory_bytes: int | None,
        budget: Callable[[str], None],
    ):
        self.process, self.limits, self.codec = process, limits, codec
        self.memory_bytes, self.budget = memory_bytes, budget

    def frame(self, request: Asks[Any]) -> bytes:
        encoder = protocol.Encoder(self.codec)
        return protocol.pack_frame(protocol.request_header(request, encoder), encoder.blobs)

    def send(self, frame: bytes, deadline: Deadline, what: str) -> None:
        """Write a frame; a worker that no longer reads its pipe has ended (WorkerCrashed)."""
        try:
            _write_all(self.process, frame, deadline, what)
        except (BrokenPipeError, OSError):  # nothing reads the pipe any more
            raise self.crashed(what) from None

    def exchange(self, request: Asks[Any], deadline: Deadline, what: str) -> protocol.Reply:
        """One untimed request and its reply. A worker that ended before reading the request raises
        EndedBeforeRequest (it ended on its own, between requests)."""
        try:
            self.send(self.frame(request), deadline, what)
        except WorkerCrashed as exc:
            raise EndedBeforeRequest(str(exc)) from None
        try:
            return self.receive(request.op, deadline, what)
        except WorkerCrashed as exc:
            if self.request_unread():
                raise EndedBeforeRequest(str(exc)) from None
            raise

    def request_unread(self) -> bool:
        """Whether the worker has ended with bytes of the request written last still in the pipe, unread."""
        if self.process.alive():
            return False
        try:
            unread = fcntl.ioctl(self.process.to_worker, termios.FIONREAD, b"\0" * 4)
        except OSError:
            return False
        return int.from_bytes(unread, sys.byteorder, signed=True) > 0

    def receive(self, op: str, deadline: Deadline, what: str, charge: bool = True) -> protocol.Reply:
        """The reply to `op`, read within `deadline`, bounded by the frame limits and checked against the
        protocol before it is used; one that cannot be read safely is the worker's fault (WorkerCrashed)."""

        def read_exact(n: int) -> bytes:
            return self.read(n, deadline, what, charge)

        def read_into(view: memoryview) -> None:  # a blob, straight into its tensor's memory
            while view:
                chunk = self.read(min(len(view), 1 << 20), deadline, what, charge)
                view[: len(chunk)] = chunk
                view = view[len(chunk) :]

        def parse() -> protocol.Reply:
            header, blobs = protocol.read_frame(read_exact, self.limits, read_into)
            decoder = protocol.Decoder(blobs, self.limits, self.codec.from_wire)
            return protocol.parse_reply(op, header, decoder)

        try:
            reply = parse()
        except ProtocolError as exc:
            problem = str(exc)
        except WorkerError:  # a deadline, a budget or the worker's end, met while reading: as it is
            raise
        except Exception as exc:  # any other trouble decoding an answer is the answer's: the worker's fault
            problem = f"it could not be decoded ({type(exc).__name__}: {protocol.clean_text(str(exc), 200)})"
        else:
            deadline.check(what)
            return reply
        # Raised outside `except`, so the refused answer is let go: raised inside, the WorkerCrashed would
        # keep the ProtocolError as its context, and through its traceback parse()'s blobs (up to reply_mib)
        # for as long as a caller holds it, and a second such answer would be held beside the first.
        raise WorkerCrashed(f"the worker's answer while {what} could not be read safely: {problem}")

    def read(self, n: int, deadline: Deadline, what: str, charge: bool = True) -> bytes:
        """`n` bytes from the worker. `charge`: stop once the CPU budget is spent (a walk of the worker's
        processes per chunk); a timed call does not, so that every timed worker pays the same (`TimedCalls`)."""
        chunks = []
        while n:
            deadline.check(what)
            if charge:
                self.budget(what)
            ready, _, _ = select.select([self.process.from_worker], [], [], min(deadline.left(), 0.5))
            if not ready:
                continue
            chunk = os.read(self.process.from_worker, min(n, 1 << 20))
            if not chunk:
                raise self.crashed(what)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def crashed(self, what: str, detail: str | None = None) -> WorkerCrashed:
        return ended_while(self.process, what, self.memory_bytes, detail)


def ended_while(
    process: launcher.WorkerProcess | None, what: str, memory_bytes: int | None, detail: str | None = None
) -> WorkerCrashed:
    """The error for a worker that ended (or was never there) while `what`, saying how it ended."""
    code = None
    if process is not None:
        try:
            code = process.process.wait(timeout=5)
        except Exception:
            code = None
        if detail is None and process.went_over_memory():
            detail = (
                f"it was killed for using more than the submission's {(memory_bytes or 0) / (1 << 30):g} GiB of "
                "memory (all its processes together)"
            )
    return WorkerCrashed(f"the process running your code ended while {what}: {detail or describe_exit(code)}")


class Quiet(Protocol):
    """Quiet timing's lock as a worker's client takes it (`devices.QuietLock`): `request()` holds it while the
    submission's code may run and yields the seconds it waited for it; it raises (never a `WorkerError`: the
    grader's trouble) when it waited too long."""

    def request(self) -> AbstractContextManager[float]: ...


class Worker:
    """One submission's worker: its lifecycle (`Lifecycle`, `start`, `kill`), its budgets, and its requests,
    each sent over the running process's `Channel`; a failure goes through one `RestartPolicy`, whose decisions
    are remembered: a submission whose loading fails or hangs is not restarted again and again."""

    def __init__(self, cells: list[WireCell], filename: str, config: WorkerConfig):
        self.cells, self.filename, self.config = [list(c) for c in cells], filename, config
        self.state = Lifecycle.IDLE
        self.why: str | None = None  # why, in a final state
        self.process: launcher.WorkerProcess | None = None
        self.channel: Channel | None = None  # to the process, while there is one
        self.capture: OutputCapture | None = None
        self.policy = RestartPolicy(config.crashes_before_giving_up)
        self.load_report: Loaded | None = None
        self.skipped_cells: list[int] = []  # top-level cells stopped for running too long
        self.booted = False  # a worker has started Python and torch once: the environment can run it
        self.starts = 0
        self.events: list[str] = []
        self.outputs: list[str] = []
        self.codec: protocol.TensorCodec | None = None  # made on first use (torch is imported lazily)
        self.in_force: dict[str, str] = {}  # what held the worker in (probe.describe_isolation)
        self.cpu_spent = 0.0  # CPU seconds of workers already ended
        self._cpu_look: tuple[launcher.WorkerProcess | None, float, float] | None = None  # (process, when, used)
        self._request_cpu: tuple[RequestCpu, str] | None = None  # the request under way's CPU deadline, and hint
        self.memory_peak: int | None = None  # the most memory the worker's processes used together
        self.allowed: bwrap.AllowList | None = None  # the sandbox's allow list, if not `bwrap.allow_list()`
        self.fresh_because: str | None = None  # why a worker was started fresh although a fork was asked for
        self.quiet: Quiet | None = None  # set for a submission's worker: it runs only in its own requests
        self.quiet_waited = 0.0  # seconds its requests waited for the quiet lock, in all (not the submission's)
        self._turns = 0  # requests (and starts) under way: the lock is taken by the outermost
        try:
            self.isolation = probe.choose_isolation(config.isolation)
        except (OSError, ValueError) as exc:
            raise WorkerError(str(exc)) from None
        self.budget_end = time.monotonic() + config.submission_seconds

    # -- what the policy and the lifecycle decided, as callers read it
    @property
    def hung(self) -> dict[str, str]:
        return self.policy.hung

    @property
    def crashes(self) -> dict[str, list[str]]:
        return self.policy.crashes

    @property
    def ended_between(self) -> list[str]:
        return self.policy.ended_between

    @property
    def prestarted(self) -> bool:
        return self.state is Lifecycle.PRESTARTED

    @property
    def cannot_start(self) -> str | None:
        return self.why if self.state is Lifecycle.CANNOT_START else None

    @property
    def load_failure(self) -> str | None:
        return self.why if self.state is Lifecycle.LOAD_FAILED else None

    @property
    def given_up(self) -> str | None:
        return self.why if self.state is Lifecycle.GIVEN_UP else None

    def _end(self, state: Lifecycle, why: str) -> None:
        """Into a final state: the process (if any) is killed, and every later request fails with `why`."""
        self.kill()
        self.state, self.why = state, why

    def refuse_load(self, why: str) -> None:
        """The file cannot be loaded (it is not a submission the worker can read): no request will run."""
        self._end(Lifecycle.LOAD_FAILED, why)

    # -- lifecycle
    def _spawn(self, fork: bool = True) -> None:
        """Start a worker process: forked from this process's fork server when the settings ask for one and it
        can, else fresh (`fresh_because` says why, when a fork was asked for)."""
        self.process = launcher.launch(
            launcher.LaunchSettings(self.config, self.isolation, self.filename, self.allowed, fork)
        )
        self.channel = Channel(self.process, self.config.limits, self._codec(), self.config.memory_bytes, self._budget)
        self.fresh_because = self.process.fresh_because or self.fresh_because
        self.in_force = dict(self.process.in_force)
        self.capture = OutputCapture(self.process.output, self.config.output_bytes)
        self.capture.start()

    def _refuse_if_final(self) -> None:
        """Raise, saying why, in a final state: no request runs again."""
        if self.state is Lifecycle.CANNOT_START:
            raise WorkerCannotStart(self.why or "")
        if self.state is Lifecycle.LOAD_FAILED:
            raise LoadFailed(self.why or "")
        if self.state is Lifecycle.GIVEN_UP:
            raise WorkerCrashed(self.why or "")

    def start(self, check: CheckBudget | None = None) -> Loaded:
        """Start (or restart) the worker and load the submission, the load in its turn (`_turn`). Returns the
        load report. The start runs within `boot_seconds`, the load within `load_seconds`, both within what is left
        of `check` if given: a restart stopped by the check's budget fails only the request that needed it
        (CheckTimeUp). A first worker that cannot start Python and torch is the grader's environment's fault
        (WorkerCannotStart)."""
        if self.state in (Lifecycle.CANNOT_START, Lifecycle.LOAD_FAILED):
            self._refuse_if_final()
        self.starts += 1
        if self.state is not Lifecycle.PRESTARTED:  # a prestarted process is adopted
            self._spawn()
        self.state = Lifecycle.STARTING
        try:
            ready = self._boot(check)
            if self.config.device.startswith("cuda") and not ready.cuda:
                if self.isolation != "namespace":
                    self.kill()
                    raise WorkerCannotStart(
                        "the worker cannot see the CUDA device (torch in the worker reports no CUDA device)"
                    )
                # Some drivers need more than the sandbox shows; grade anyway, and say so.
                self.kill()
                self.isolation = "process"
                self.events.append("CUDA was not visible inside the namespace sandbox: fell back to process isolation")
                return self.start(check)
            try:
                with self._turn(check) as check:  # the file's code runs from here on: Python and torch are ours
                    reply = self._load(check)
            except EndedBeforeRequest as exc:
                reply = self._ended_before_the_file(exc, check)
        except WorkerCannotStart:
            raise
        except CheckTimeUp as exc:
            self.kill()
            raise CheckTimeUp(f"the worker running your code had ended, and restarting it: {exc}") from None
        except WorkerTimeout as exc:
            self._end(
                Lifecycle.LOAD_FAILED,
                str(exc)
                if isinstance(exc, BudgetSpent)
                else f"loading your file did not finish within {self.config.load_seconds:g} s "
                "(an infinite loop or a very slow cell at the top level?)",
            )
            raise LoadFailed(self.why or "") from None
        except WorkerError as exc:
            self.kill()
            last = self.output().strip().splitlines()[-3:]
            self.state, self.why = (
                Lifecycle.LOAD_FAILED,
                f"loading your file ended the worker: {exc}"
                + ("\nIts last output:\n" + "\n".join(last) if last else ""),
            )
            raise LoadFailed(self.why) from None
        if not reply.ok or not isinstance(reply.value, Loaded):
            self._end(Lifecycle.LOAD_FAILED, f"loading your file failed in the worker: {reply.error}")
            raise LoadFailed(self.why or "")
        self.state = Lifecycle.RUNNING
        if self.load_report is None:
            self.load_report = reply.value
            self.skipped_cells = [e.cell for e in reply.value.errors if e.timed_out]
        return reply.value

    def _load(self, check: CheckBudget | None) -> protocol.Reply:
        """Send the file to the new worker and wait for its load report (within `load_seconds`)."""
        request = LoadRequest(
            self.cells, self.filename, self.config.cell_seconds, self.config.later_cell_seconds, self.skipped_cells
        )
        deadline = self._deadline(self.config.load_seconds, check=check)
        return self._channel("loading your file").exchange(request, deadline, "loading your file")

    def _ended_before_the_file(self, exc: EndedBeforeRequest, check: CheckBudget | None) -> protocol.Reply:
        """The new worker said ready, then ended before it read the file (killed from outside, say): none of the
        submission's code ran, so it is never the submission's failure. A forked worker is let go and a fresh one
        loads the file instead; the first worker, fresh, means that the worker cannot start here (the grader's
        fault, WorkerCannotStart). A restarted fresh worker's end counts as before (a crash while loading)."""
        forked = self.process is not None and self.process.forked
        if not forked and self.starts > 1:
            raise exc
        said = self._discard()
        why = f"it ended before it read the file ({exc})" + (f"; it said: {said}" if said else "")
        if not forked:
            self.state, self.why = (
                Lifecycle.CANNOT_START,
                "the grader's worker could not start, before any code of the submission ran (the grader's "
                f"environment is at fault): {why}",
            )
            raise WorkerCannotStart(self.why)
        self.fresh_because = f"a forked worker said it was ready, then {why}"
        self._spawn(fork=False)
        self._boot(check)
        return self._load(check)

    def prestart(self) -> None:
        """Start the first worker's process now, so that Python, its jail and torch load while the grader
        does other work; nothing of the submission runs until the first request `start`s it (which then
        only waits for its `ready` and loads the file, as it would have anyway)."""
        if self.state is Lifecycle.IDLE and self.process is None and self.starts == 0:
            try:
                self._spawn()
            except (WorkerError, OSError):
                return  # `start` tries again, and fails where a failure to start is said
            self.state = Lifecycle.PRESTARTED

    def _boot(self, check: CheckBudget | None) -> Ready:
        """Wait for the new worker's `ready`: Python, its jail and torch, before any of the submission's code.
        The first worker failing here is the grader's environment's fault, never the submission's."""
        try:
            what = "starting Python and torch"
            ready = self._ready(check, what)
            if not ready.ok or not isinstance(ready.value, Ready):
                raise WorkerCrashed("the worker could not start")
        except WorkerError as exc:
            if self.booted:
                raise
            self.kill()
            last = self.output().strip().splitlines()[-5:]
            self.state, self.why = (
                Lifecycle.CANNOT_START,
                "the grader's worker could not start Python and torch, before any code of the submission ran "
                f"(the grader's environment is at fault): {exc}"
                + ("\nIts last output:\n" + "\n".join(last) if last else ""),
            )
            raise WorkerCannotStart(self.why) from None
        self.booted = True
        if self.process is not None:
            self.process.find_main(ready.value.pid)  # before any code of the submission runs
        return ready.value

    def _ready(self, check: CheckBudget | None, what: str) -> protocol.Reply:
        """The new worker's first frame. A forked worker that its fork server did not hand over, or that ended
        before it was ready (before any code of the submission ran), is let go, and a fresh one started instead:
        the fork server's trouble is never the submission's, nor a reason not to grade."""
        deadline = self._deadline(self.config.boot_seconds, check=check)
        process = self._running(what)
        problem = process.started(deadline.left())
        if problem is None:
            try:
                reply = self._channel(what).receive("ready", deadline, what)
            except WorkerTimeout:
                if not process.forked:
                    raise
                problem = "a forked worker did not say it was ready in time"
            except WorkerError as exc:
                if not process.forked:
                    raise
                problem = f"a forked worker ended before it was ready ({exc})"
            else:
                if not process.forked or (reply.ok and isinstance(reply.value, Ready)):
                    return reply
                problem = "a forked worker's first answer was not `ready`"
        said = self._discard()
        self.fresh_because = problem + (f"; it said: {said}" if said else "")
        self._spawn(fork=False)
        return self._channel(what).receive("ready", self._deadline(self.config.boot_seconds, check=check), what)

    def _discard(self) -> str:
        """End a forked worker that never became one (nothing of the submission ran in it): its output and CPU
        time are not the submission's. Returns the last lines it printed (the grader's trouble, for the note)."""
        process, capture = self.process, self.capture
        self.process, self.channel, self.capture = None, None, None
        if process is not None:
            process.kill()
        if capture is None:
            return ""
        capture.join(timeout=2)
        return " | ".join(capture.text().strip().splitlines()[-3:])

    def alive(self) -> bool:
        """Whether a started worker runs (and has loaded the file): a prestarted one is not started yet."""
        return self.state is Lifecycle.RUNNING and self.process is not None and self.process.alive()

    def _ended_on_its_own(self) -> None:
        """The worker ended between two requests (the submission's code exited it after answering, or a
        thread of its own crashed it): remembered, and after `crashes_before_giving_up` times, not restarted
        again."""
        ended = str(self._crashed("waiting for the grader's next request"))
        self.kill()
        self.events.append(ended)
        given_up = self.policy.ended(ended)
        if given_up:
            self.state, self.why = Lifecycle.GIVEN_UP, given_up

    def kill(self) -> None:
        """End the process, if any, keeping its CPU time, memory peak and output; the next request starts a new
        one (unless the worker is in a final state)."""
        if self.state not in FINAL:
            self.state = Lifecycle.IDLE
        if self.process is None:
            return
        self.process.kill()
        self.cpu_spent += self.process.cpu_seconds()
        if self.process.memory_peak is not None:
            self.memory_peak = max(self.memory_peak or 0, self.process.memory_peak)
        if self.capture:
            self.capture.join(timeout=2)
            text = self.capture.text()
            if text:
                self.outputs.append(text)
        self.process, self.channel = None, None

    close = kill

    def output(self) -> str:
        texts = list(self.outputs)
        if self.capture and self.process is not None:
            texts.append(self.capture.text())
        return "\n".join(t for t in texts if t)

    # -- process control, for timing
    def suspend(self) -> None:
        if self.process is not None:
            self.process.suspend()

    def resume(self) -> None:
        """Back to how it is between requests: running, or stopped for a worker with a `quiet` lock."""
        if self.process is not None:
            if self.quiet is not None:
                self.process.suspend()
            else:
                self.process.resume()

    @contextlib.contextmanager
    def _turn(self, check: CheckBudget | None) -> Iterator[CheckBudget | None]:
        """Around a request or a start: with a `quiet` lock, hold it shared and continue the worker's processes,
        then stop them all again. The time waited for the lock moves the submission's budget and `check`'s end
        (the check given back), so it is charged to neither. Nested turns are the outermost's."""
        if self.quiet is None or self._turns:
            yield check
            return
        with self.quiet.request() as waited:
            self.quiet_waited += waited
            self.budget_end += waited
            check = self._moved(check, self.quiet_waited - waited)
            self._turns += 1
            try:
                if self.process is not None and self.process.stopped:
                    self.process.resume()
                yield check
            finally:
                self._turns -= 1
                self._rest()

    def _moved(self, check: CheckBudget | None, since: float) -> CheckBudget | None:
        """`check`, its end moved by what was waited for the quiet lock since `quiet_waited` was `since`."""
        waited = self.quiet_waited - since
        return CheckBudget(check.end + waited, check.seconds) if check is not None and waited else check

    def _rest(self) -> None:
        """Stop every process of a worker that has begun loading the file."""
        process = self.process
        loaded = self.state in (Lifecycle.STARTING, Lifecycle.RUNNING)
        if process is not None and loaded and process.alive():
            process.suspend()

    def cpu_seconds(self) -> float:
        """CPU time of the running worker's processes, ended ones included (see `cpu_spent` for the workers
        already ended)."""
        return self.process.cpu_seconds() if self.process is not None else 0.0

    def thread_waits(self) -> dict[int, int]:
        """Nanoseconds the running worker's thread that answers requests has spent ready to run but waiting for
        a CPU (held by other processes), by thread id (`launcher.WorkerProcess.thread_waits`)."""
        return self.process.thread_waits() if self.process is not None else {}

    def _cpu_used(self, fresh: bool = False) -> float:
        """CPU seconds of the submission's workers so far, ended ones included, looked at at most every
        `BUDGET_LOOK_SECONDS` of one process (unless `fresh`): without a control group each look walks /proc
        (every process of the machine, a few milliseconds where there are hundreds), and a reply is read in
        several chunks, each charged. Between two looks the worker can spend at most that long times its cores
        beyond a limit."""
        now = time.monotonic()
        last = self._cpu_look
        if not fresh and last is not None and last[0] is self.process and now - last[1] < BUDGET_LOOK_SECONDS:
            return last[2]
        used = self.cpu_spent + self.cpu_seconds()
        self._cpu_look = (self.process, now, used)
        return used

    def _cpu_budget_left(self) -> bool:
        """Whether the submission's CPU budget is not spent yet (never looked at when there is none)."""
        limit = self.config.submission_cpu_seconds
        return limit is None or self._cpu_used() < limit

    def _budget(self, what: str) -> None:
        """Raise BudgetSpent once the submission's CPU budget is spent, and WorkerTimeout once the request under way
        has used its own CPU time (`RequestCpu`)."""
        if not self._cpu_budget_left():
            raise BudgetSpent(
                f"{what} was stopped: the CPU time budget for the whole submission "
                f"({self.config.submission_cpu_seconds:g} CPU seconds) is used up"
            )
        if self._request_cpu is not None:
            deadline, hint = self._request_cpu
            deadline.check(self._cpu_used(), what, hint)

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
        self._request_cpu = (replace(cpu, start=self._cpu_used(fresh=True)), overrun_hint) if cpu is not None else None
        try:
            reply = self._channel(what).exchange(request, self._deadline(timeout, overrun_hint, check), what)
        except EndedBeforeRequest:  # it ended before reading this request: restarted for it, or given up on
            self._ended_on_its_own()
            return self._request(request, timeout, target, overrun_hint, timed, check, reference_cpu)
        except (WorkerTimeout, WorkerCrashed) as exc:
            self.failed(exc, target, timed)
            raise
        finally:
            self._request_cpu = None
        if reply.error is not None:  # not ok: the student's code raised
            raise SubmissionError(reply.error)
        answer: V = reply.value  # what REPLIES[op] made: the type the request asks for
        return answer

    def failed(self, exc: WorkerError, target: str | None, timed: bool) -> None:
        """The one failure policy of every request, untimed or timed: a timeout or crash is remembered
        (`RestartPolicy.failed`) and said, and the worker killed (the next request starts a new one)."""
        self.policy.failed(exc, target, timed)
        self.events.append(str(exc))
        self.kill()

    def _ready_for(self, op: str, target: str | None, check: CheckBudget | None) -> None:
        """Before a request is sent: refuse it when a budget is spent or its target is known to hang or
        crash, and start the worker (again) when it is not running."""
        if time.monotonic() >= self.budget_end:
            raise BudgetSpent(
                f"{target or op} was not run: the time budget for the whole submission "
                f"({self.config.submission_seconds:g} s) is used up"
            )
        if not self._cpu_budget_left():
            raise BudgetSpent(
                f"{target or op} was not run: the CPU time budget for the whole submission "
                f"({self.config.submission_cpu_seconds:g} CPU seconds, all its processes together) "
                "is used up"
            )
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

    def _deadline(
        self, seconds: float, overrun_hint: str = "an infinite loop?", check: CheckBudget | None = None
    ) -> Deadline:
        return Deadline.within(seconds, self.budget_end, overrun_hint, check)

    def _codec(self) -> protocol.TensorCodec:
        if self.codec is None:
            import torch

            self.codec = protocol.TensorCodec(torch)
        return self.codec

    def _running(self, what: str) -> launcher.WorkerProcess:
        if self.process is None:
            raise self._crashed(what)
        return self.process

    def _channel(self, what: str) -> Channel:
        """The channel to the running process (WorkerCrashed when there is none)."""
        if self.channel is None:
            raise self._crashed(what)
        return self.channel

    def _crashed(self, what: str, detail: str | None = None) -> WorkerCrashed:
        return ended_while(self.process, what, self.config.memory_bytes, detail)


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
            self.worker._budget(self.what)
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


def describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0 or code > 128:
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = {
            "SIGSEGV": " (a segmentation fault)",
            "SIGKILL": " (killed, often for using too much memory)",
            "SIGABRT": " (aborted)",
        }.get(name, "")
        return f"it was ended by {name}{hint}"
    return f"it exited with status {code} (does your code call exit() or os._exit()?)"


def _write_all(process: launcher.WorkerProcess, data: bytes, deadline: Deadline, what: str) -> None:
    view = memoryview(data)
    while view:
        deadline.check(what, why="the worker stopped reading")
        _, ready, _ = select.select([], [process.to_worker], [], min(deadline.left(), 0.5))
        if ready:
            try:  # the pipe does not block (see `launch`): a worker that read a little and stopped cannot hold us
                view = view[os.write(process.to_worker, view[: 1 << 16]) :]
            except BlockingIOError:
                continue
        elif not process.alive():
            raise BrokenPipeError
