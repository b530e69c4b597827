"""The worker's lifecycle: its processes, one after another, from a start to a kill.

`WorkerProcesses` runs one worker process at a time (through `launcher`): spawned (forked from the fork server or
fresh), its output drained, its CPU time and memory kept when it is killed, and, for a worker given a `quiet` lock,
stopped outside its turns. `WorkerLifecycle` starts one and loads the submission in it, restarts it after a hang or
a crash, and says where it stands (`Lifecycle`); a failure goes through one `RestartPolicy`, whose decisions are
remembered: a submission whose loading fails or hangs is not restarted again and again.

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
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from autograder.sandbox import bwrap, launcher, probe, protocol
from autograder.sandbox.budgets import Budgets
from autograder.sandbox.channel import Channel, OutputCapture, ended_while
from autograder.sandbox.errors import (
    BudgetSpent,
    CheckBudget,
    CheckTimeUp,
    Deadline,
    EndedBeforeRequest,
    LoadFailed,
    WorkerCannotStart,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
)
from autograder.sandbox.protocol import Loaded, LoadRequest, Ready
from autograder.sandbox.settings import WorkerConfig

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


class Quiet(Protocol):
    """Quiet timing's lock as a worker's client takes it (`devices.QuietLock`): `request()` holds it while the
    submission's code may run and yields the seconds it waited for it; it raises (never a `WorkerError`: the
    grader's trouble) when it waited too long."""

    def request(self) -> AbstractContextManager[float]: ...


class WorkerProcesses:
    """One submission's worker processes, one at a time: spawned, drained, killed (its CPU time, memory peak and
    output kept), stopped outside its turns when it has a `quiet` lock; and the submission's `Budgets`."""

    def __init__(self, cells: list[WireCell], filename: str, config: WorkerConfig):
        self.cells, self.filename, self.config = [list(c) for c in cells], filename, config
        self.state = Lifecycle.IDLE
        self.why: str | None = None  # why, in a final state
        self.process: launcher.WorkerProcess | None = None
        self.channel: Channel | None = None  # to the process, while there is one
        self.capture: OutputCapture | None = None
        self.events: list[str] = []
        self.outputs: list[str] = []
        self.codec: protocol.TensorCodec | None = None  # made on first use (torch is imported lazily)
        self.in_force: dict[str, str] = {}  # what held the worker in (probe.describe_isolation)
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
        self.budgets = Budgets(config, lambda: self.process, self.cpu_seconds)

    # -- the budgets, as callers read and move them
    @property
    def budget_end(self) -> float:
        return self.budgets.end

    @budget_end.setter
    def budget_end(self, end: float) -> None:
        self.budgets.end = end

    @property
    def cpu_spent(self) -> float:
        """CPU seconds of workers already ended."""
        return self.budgets.spent

    @cpu_spent.setter
    def cpu_spent(self, seconds: float) -> None:
        self.budgets.spent = seconds

    # -- lifecycle
    def _spawn(self, fork: bool = True) -> None:
        """Start a worker process: forked from this process's fork server when the settings ask for one and it
        can, else fresh (`fresh_because` says why, when a fork was asked for)."""
        self.process = launcher.launch(
            launcher.LaunchSettings(self.config, self.isolation, self.filename, self.allowed, fork)
        )
        self.channel = Channel(
            self.process, self.config.limits, self._codec(), self.config.memory_bytes, self.budgets.charge
        )
        self.fresh_because = self.process.fresh_because or self.fresh_because
        self.in_force = dict(self.process.in_force)
        self.capture = OutputCapture(self.process.output, self.config.output_bytes)
        self.capture.start()

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

    # -- quiet turns, and process control for timing
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

    def _deadline(
        self, seconds: float, overrun_hint: str = "an infinite loop?", check: CheckBudget | None = None
    ) -> Deadline:
        return self.budgets.deadline(seconds, overrun_hint, check)

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


class WorkerLifecycle(WorkerProcesses):
    """The worker started, loaded, restarted and ended (`Lifecycle`): a start waits for the process's `ready`
    (Python, its jail and torch) and loads the file; the first process that cannot start is the grader's
    environment's fault; a final state refuses every later request, saying why."""

    def __init__(self, cells: list[WireCell], filename: str, config: WorkerConfig):
        super().__init__(cells, filename, config)
        self.policy = RestartPolicy(config.crashes_before_giving_up)
        self.load_report: Loaded | None = None
        self.skipped_cells: list[int] = []  # top-level cells stopped for running too long
        self.booted = False  # a worker has started Python and torch once: the environment can run it
        self.starts = 0

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

    def _load(self, check: CheckBudget | None) -> protocol.Reply[Loaded]:
        """Send the file to the new worker and wait for its load report (within `load_seconds`)."""
        request = LoadRequest(
            self.cells, self.filename, self.config.cell_seconds, self.config.later_cell_seconds, self.skipped_cells
        )
        deadline = self._deadline(self.config.load_seconds, check=check)
        return self._channel("loading your file").exchange(request, deadline, "loading your file")

    def _ended_before_the_file(self, exc: EndedBeforeRequest, check: CheckBudget | None) -> protocol.Reply[Loaded]:
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

    def _ready(self, check: CheckBudget | None, what: str) -> protocol.Reply[Ready]:
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
