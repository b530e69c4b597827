"""What the checks share: the narrow interface to the submission, hidden inputs, and comparisons.

Checks never see the student's objects, only what the worker answers: decoded tensors and plain data
(`protocol.ModuleInfo` for a module living in the worker, `protocol.Foreign` for anything else).
Everything a check compares against is computed here, in the trusted process, by `reference/`.

A check fails the student only through `fail()` (or `NotCredited`, when what it rests on is wrong). Any
other exception in a check is the grader's own fault: the run then cannot grade rather than charge the
student.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, ParamSpec, TypeVar

import pytest
import torch

from autograder.contract import PART_OF_NAME
from autograder.grading.graphs import CANNOT_CAPTURE, HIDDEN_FROM_CAPTURE, NOT_REPLAYABLE, READY_MADE
from autograder.grading.plugin import CheckFailed, NotCharged, NotCredited, SharedProblem
from autograder.model import NOT_DONE_STUB
from autograder.rubric import Rubric
from autograder.sandbox.client import (
    CheckBudget,
    LoadFailed,
    SubmissionError,
    TimedCalls,
    Worker,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
)
from autograder.sandbox.protocol import (
    MISSING,
    Asks,
    BuildRequest,
    CallRequest,
    Captured,
    CaptureRequest,
    CellProblem,
    DescribeRequest,
    Foreign,
    ForwardManyRequest,
    ForwardReply,
    ForwardRequest,
    GetRequest,
    Handle,
    ModuleInfo,
    ReplayRequest,
    StandInRequest,
    ToRequest,
)

# The cause of every check that cannot load its weights into the student's module (see scoring.name_once).
CONSTRUCTOR_CAUSE = "your {} does not keep the given constructor, so the grader cannot build it with its weights"
P = ParamSpec("P")
R = TypeVar("R")
V = TypeVar("V")  # what a request asks for (`protocol.Asks`)
M = TypeVar("M", bound=torch.nn.Module)
__all__ = [
    "CANNOT_CAPTURE",
    "HIDDEN_FROM_CAPTURE",
    "NOT_REPLAYABLE",
    "READY_MADE",
    "Foreign",
    "ForwardReply",
    "NotCharged",
    "NotCredited",
]


@dataclass
class Notes:
    """What the checks sent to the submission and compared, kept by a grading that is asked to
    (`grade.Options.notes`: `explain` replays a disputed grade with one); `check` is the running check's id,
    which the grading's plugin sets (`fixtures.GradingFixtures`)."""

    check: str = ""
    items: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, **values: Any) -> None:
        self.items.append({"check": self.check, "kind": kind, **values})


# The notes of the grading whose checks are running, bound by `grade.run_checks` (`noting`) for that run only:
# the checks' helpers reach them here rather than through every call. None: that grading keeps none.
_running_notes: ContextVar[Notes | None] = ContextVar("running_notes", default=None)


@contextmanager
def noting(notes: Notes | None) -> Iterator[None]:
    """`note` adds to `notes` while the block runs (a grading's checks), to nothing again after it."""
    token = _running_notes.set(notes)
    try:
        yield
    finally:
        _running_notes.reset(token)


def note(kind: str, **values: Any) -> None:
    """Remember what the running check sent to the submission or compared, when its grading keeps notes."""
    notes = _running_notes.get()
    if notes is not None:
        notes.add(kind, **values)


@dataclass(frozen=True)
class Failure:
    """A check's failure as data, from where it is found (`attempt`, `value_problem`, a part's own comparisons)
    to `fail` and the scorer: the message for the student; the likely mistake it names (`mistake`, see
    `model.CheckResult`); what went wrong (`diagnosis`, else the mistake; see `fail`); for a problem many
    checks share (a name a cell with a syntax error left undefined), its `cause` and the part that `owner`s it
    (`plugin.SharedProblem`); and for a message that explains its likely mistake (`explained`), what it says
    before that explanation (`detail`), which is all a row keeps where the explanation is said in full
    elsewhere (`scoring.say_once`). Words made from it keep the rest with `reworded` and `after`."""

    message: str
    mistake: str = ""
    diagnosis: str = ""
    cause: str = ""
    owner: str = ""
    # The message up to where it explains its likely mistake, that explanation's label included ("...: values
    # differ ...\nLikely mistake: "): what differed on this input, without the explanation. "" when the
    # message explains none.
    detail: str = ""

    def __post_init__(self) -> None:
        if not self.diagnosis:
            object.__setattr__(self, "diagnosis", self.mistake)

    def __str__(self) -> str:
        return self.message

    def reworded(self, message: str) -> Failure:
        """The same failure in other words: words added after what it said, so that its `detail` still starts them."""
        return replace(self, message=message)

    def after(self, words: str) -> Failure:
        """The same failure, its message after `words`."""
        return replace(self, message=f"{words}{self.message}", detail=f"{words}{self.detail}" if self.detail else "")

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        """The failure a check's failure (`fail`'s, `pytest.fail`'s) carries."""
        message = getattr(exc, "msg", None)
        return cls(
            str(message) if message is not None else str(exc),
            getattr(exc, "mistake", ""),
            getattr(exc, "diagnosis", ""),
            getattr(exc, "cause", ""),
            getattr(exc, "owner", ""),
            getattr(exc, "detail", ""),
        )


LIKELY_MISTAKE, LIKELY_CAUSE = "Likely mistake: ", "Likely cause: "  # how a message's explanation starts


def explained(detail: str, explanation: str, mistake: str, diagnosis: str = "", label: str = LIKELY_MISTAKE) -> Failure:
    """A failure whose message says what differed on this input (`detail`), then on a line of its own its likely
    mistake (`explanation`, after `label`), which `mistake` names in words the same for every case (`fail`). A
    message with no `detail` starts with its explanation (and whatever it says after it goes with it). Where
    the explanation is said in full elsewhere, the row keeps what came before it (`Failure.detail`)."""
    lead = f"{detail}\n{label}" if detail else label
    return Failure(f"{lead}{explanation}", mistake, diagnosis, detail=lead)


def mistake_of(failure: object) -> str:
    """The likely mistake a `Failure` or a check's failure (`fail`'s) carries, or ""."""
    return getattr(failure, "mistake", "")


# The mistakes named by what happened to the request rather than by what the code computed.
NOT_DONE = NOT_DONE_STUB
WORKER_MISTAKES: dict[type[WorkerError], str] = {
    LoadFailed: "the file does not load",
    WorkerTimeout: "the code does not finish in time (an endless loop?)",
    WorkerCrashed: "the code ends the worker process (a crash, or an exit)",
}


UNDEFINED = re.compile(r"name '(\w+)' is not defined|(\w+) is not defined in your file")  # the worker says either
DEFINES = re.compile(r"^(?:(?:async\s+)?def|class)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=(?!=)", re.MULTILINE)


def defined_names(source: str) -> set[str]:
    """The top-level names a cell's text defines (functions, classes, assignments), read without running it.
    (The self-check reads a cell that cannot be parsed the same way.)"""
    return {def_name or assigned for def_name, assigned in DEFINES.findall(source)}


SYNTAX_ERROR = "a cell of the file has a syntax error, so the names it defines are missing"


def fail(failure: str | Failure, mistake: str = "", diagnosis: str = "") -> NoReturn:
    """Fail the current check with a message for the student (no Python traceback of ours), naming the
    likely mistake (`mistake`, else the one a `Failure` carries) for the class report's count, and what went
    wrong (`diagnosis`, else the mistake given, else the one it carries): the same words for every case
    that meets it, whatever the message says of the case. The cases of a check, and the checks of a part,
    whose failures have one diagnosis say it once (`scoring`); a failure with none is its own. A failure
    with a `cause` that many checks meet (a cell with a syntax error, `Submission.undefined`) is said in full
    once (`SharedProblem`)."""
    found = failure if isinstance(failure, Failure) else Failure(failure)
    note("failed", message=found.message)
    if found.cause:
        raise SharedProblem(found.message, cause=found.cause, mistake=found.mistake, owner=found.owner)
    raise CheckFailed(found.message, mistake or found.mistake, diagnosis or mistake or found.diagnosis, found.detail)


def fail_if(problem: Failure | None) -> None:
    """Fail with `problem`, the message a comparison found (`value_problem`, a part's `output_problem`), if any."""
    if problem:
        fail(problem)


def worker_mistake(exc: WorkerError) -> str:
    """The mistake a worker's failure names: that of its nearest listed class (a `BudgetSpent` is a
    `WorkerTimeout`), so that a new subclass can never turn a student's failure into the grader's."""
    for cls in type(exc).__mro__:
        if cls in WORKER_MISTAKES:
            return WORKER_MISTAKES[cls]
    return ""


@dataclass
class Raised:
    """An exception the student's code raised: its class name, message and traceback (in the file's lines)."""

    type: str
    message: str
    traceback: str = ""

    @property
    def stub(self) -> bool:
        """Whether this is a stub left as released (which says nothing worth quoting: it is not written yet)."""
        return self.type == "NotImplementedError"


def stub_left(raised: Raised) -> NoReturn:
    """Fail a check that met a stub still raising NotImplementedError: not done yet, whatever its message says
    (the same diagnosis wherever the stub is met, so it is said once)."""
    trace = f"\n{raised.traceback}" if raised.traceback else ""
    fail(
        f"not done yet: this still raises NotImplementedError (a stub left as released?){trace}",
        mistake=NOT_DONE,
        diagnosis=f"{raised.type}{trace}",
    )


class Submission:
    """The checks' one door into the student's code (which runs in the worker).

    Each check has a time budget (`begin_check`): a request gets the smaller of its own deadline and
    what is left of the check's budget, a restart of the worker it needs gets at most what is left of it
    too, and the worker's client enforces the whole submission's. The first request of the run starts the
    worker and loads the file outside any check's budget (within the rubric's `load_seconds`). What its
    requests waited for other gradings' timing (`Worker.quiet_waited`) moves the check's end."""

    def __init__(self, worker: Worker, device: str, check_seconds: float = 60.0):
        self.worker, self.device, self.check_seconds = worker, device, check_seconds
        self.begin_check()

    def begin_check(self) -> None:
        self.check_began = (time.monotonic(), self.worker.quiet_waited)

    @property
    def check_end(self) -> float:
        began, waited = self.check_began
        return began + self.check_seconds + self.worker.quiet_waited - waited

    def _check(self) -> CheckBudget:
        return CheckBudget(self.check_end, self.check_seconds)

    def _loaded(self) -> None:
        """Start the worker and load the file, once, before the first request; the check that asked then
        gets its whole budget. A file that cannot be loaded fails every check, saying why."""
        if self.worker.starts:
            return
        try:
            self.worker.start()
        except (LoadFailed, WorkerTimeout, WorkerCrashed) as exc:
            fail(str(exc), mistake=worker_mistake(exc))
        finally:
            self.begin_check()

    def _timeout(self) -> float:
        self._loaded()
        left = self.check_end - time.monotonic()
        if left <= 0:
            fail(
                f"this check used up its time budget ({self.check_seconds:g} s) waiting for your code",
                diagnosis=OUT_OF_BUDGET,
            )
        return min(left, self.worker.config.request_seconds)

    def _ask(
        self,
        request: Asks[V],
        target: str | None = None,
        timeout: float | None = None,
        reference_cpu: float | None = None,
    ) -> V:
        limit = self._timeout() if timeout is None else min(self._timeout(), timeout)
        try:
            return self.worker.request(
                request, timeout=limit, target=target, check=self._check(), reference_cpu=reference_cpu
            )
        except WorkerError as exc:
            self.failed(exc)

    def undefined(self, name: str, message: str) -> NoReturn:
        """Fail for a name the file does not define; one diagnosis, said once, when a syntax error is why: a
        problem the checks of other parts that need the name meet too, owned by the part whose cell it is (they
        are not charged for it)."""
        broken = unparsed(self.worker, name)
        if broken is None:
            fail(message, diagnosis=f"`{name}` is not defined")
        fail(
            Failure(
                f"cell {broken.cell} of your file, which defines {name}, has a syntax error: {broken.message}. "
                "Fix it first: nothing in that cell runs until then",
                mistake=SYNTAX_ERROR,
                cause=f"cell {broken.cell} of your file has a syntax error: {broken.message}",
                owner=PART_OF_NAME.get(name, ""),
            )
        )

    def failed(self, exc: WorkerError) -> NoReturn:
        """Fail the check for what went wrong in the worker, in the student's terms."""
        if isinstance(exc, SubmissionError):
            trace = f"\n{exc.traceback}" if exc.traceback else ""
            # what went wrong: the error's class and where it was raised (not its message, which may name the case)
            where = f"{exc.type}{trace}"
            if exc.type == "NotImplementedError":
                stub_left(Raised(exc.type, exc.message, exc.traceback or ""))
            said = f"your code raised {exc.type}" + (f": {exc.message}" if exc.message else "") + trace
            missing = UNDEFINED.fullmatch(exc.message or "")
            if exc.type == "NameError" and missing:
                self.undefined(missing.group(1) or missing.group(2), said)
            fail(said, mistake=f"your code raises {exc.type}", diagnosis=where)
        if isinstance(exc, (LoadFailed, WorkerTimeout, WorkerCrashed)):
            fail(str(exc), mistake=worker_mistake(exc))
        raise exc

    @contextmanager
    def standing_in(self, name: str, table: list[tuple[list[Any], Any]]) -> Iterator[None]:
        """While the block runs, the submission's `name` (a part this check's part calls, wrong or missing) is
        a stand-in that answers the calls in `table` ([(args, value)]: this check's inputs, values computed by
        the reference here) and nothing else; the submission's own is put back after, so that no other check
        meets the stand-in. The worker receives values only, never the reference's code."""
        note("stand-in", what=name, calls=len(table))
        self._ask(StandInRequest(name, [[_wire(list(args)), value] for args, value in table]))
        try:
            yield
        finally:
            with contextlib.suppress(pytest.fail.Exception):  # a worker gone since has its own namespace again
                self._ask(StandInRequest(name, None))

    def value(self, name: str) -> Any:
        answer = self._ask(GetRequest(name))
        if answer is MISSING:
            self.undefined(name, f"`{name}` is not defined in your file")
        return answer

    def call(self, fn: str, *args: Any, target: str | None = None, **kwargs: Any) -> Any:
        note("call", what=fn, args=list(args))
        answer = self._ask(CallRequest(fn, _wire(list(args)), _wire(kwargs)), target=target or fn)
        note("returned", what=fn, value=answer)
        return answer

    def try_call(self, fn: str, *args: Any, target: str | None = None) -> Any:
        """Like call, but when the student's code raises, return that exception as a `Raised`."""
        note("call", what=fn, args=list(args))
        try:
            answer = self.worker.request(
                CallRequest(fn, _wire(list(args)), {}),
                timeout=self._timeout(),
                target=target or fn,
                check=self._check(),
            )
        except SubmissionError as exc:
            raised = Raised(exc.type, exc.message, exc.traceback or "")
            note("returned", what=fn, value=raised)
            return raised
        except (LoadFailed, WorkerTimeout, WorkerCrashed) as exc:
            fail(str(exc), mistake=worker_mistake(exc))
        note("returned", what=fn, value=answer)
        return answer

    def build(
        self,
        cls: str,
        *args: Any,
        state_dict: dict[str, torch.Tensor] | None = None,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> ModuleInfo:
        """The student's `cls(*args, **kwargs)`, holding `state_dict` (the hidden weights) when given. A
        constructor that is not the given one (other arguments, or other attributes than the grader loads
        its weights into) is one problem, said once (`NotCredited` with a cause), in the student's terms."""
        dtype_name = str(dtype).removeprefix("torch.") if dtype is not None else None
        note("build", what=cls, args=list(args), kwargs=kwargs, weights=state_dict is not None, dtype=dtype_name)
        request = BuildRequest(cls, list(args), kwargs, state_dict, dtype_name, self.device)
        answer, problem = attempt(self._ask, request, target=f"{cls}.__init__")
        if problem is not None:
            words = constructor_changed(self, cls, args, kwargs, state_dict, dtype_name)
            if words:
                raise NotCredited(words, cause=CONSTRUCTOR_CAUSE.format(cls), owner=PART_OF_NAME.get(cls, ""))
            fail(problem)
        if not isinstance(answer, ModuleInfo):
            fail(f"building {cls} did not give a module")
        return answer

    def to_device(self, module: ModuleInfo, target: str) -> ModuleInfo:
        """Move a module the student's code returned to the grading device (`build` puts the modules the
        grader builds there): a function that makes a module makes it on the CPU, wherever it is graded."""
        if self.device == "cpu":
            return module
        return self._ask(ToRequest(module.handle, self.device), target=target)

    def describe(self, module: ModuleInfo) -> ModuleInfo:
        return self._ask(DescribeRequest(module.handle))

    def forward(
        self,
        module: ModuleInfo,
        x: torch.Tensor,
        *,
        train: bool = False,
        seed: int = 0,
        grad_out: torch.Tensor | None = None,
        hooks: bool = False,
        reference_cpu: float | None = None,
    ) -> ForwardReply:
        """`module`'s forward of `x` in the worker. `reference_cpu`: the CPU seconds the reference's forward of the
        same input took here (`reference_cost`), which the request's CPU deadline follows (`client.RequestCpu`);
        without it, the rubric's floor (`request_floor_seconds`), ample for the checks' small inputs."""
        note("input", what=f"{module.cls}.forward" + (" (training mode)" if train else ""), value=x)
        answer = self._ask(
            ForwardRequest(module.handle, x, train, seed, grad_out, hooks),
            target=f"{module.cls}.forward",
            reference_cpu=reference_cpu,
        )
        if not (isinstance(answer, ForwardReply) and isinstance(answer.x_after, torch.Tensor)):
            fail("the worker's answer did not include the input after the forward")
        return answer

    def capture(
        self,
        module: ModuleInfo,
        shape: tuple[int, ...],
        dtype_name: str,
        known: list[str],
        max_nodes: int,
        device: str = "cpu",
    ) -> Captured:
        """`module`'s forward captured as a graph of ATen operations in the worker (`protocol.CaptureRequest`), on
        a random input of `shape` on `device` (where the module was built): plain data, for the grader to judge
        (`graphs`) and a trusted worker to replay. The state tensors named in `known` (the weights the grader
        loaded) are not sent back.
        A forward that cannot be captured fails here, at its line, saying why and how to write it so it can."""
        note("capture", what=f"{module.cls}.forward", shape=list(shape), dtype=dtype_name)
        request = CaptureRequest(module.handle, list(shape), dtype_name, 0, known, max_nodes, device)
        try:
            answer = self.worker.request(
                request, timeout=self._timeout(), target=f"{module.cls}.forward", check=self._check()
            )
        except SubmissionError as exc:
            trace = f"\n{exc.traceback}" if exc.traceback else ""
            if exc.type == "NotImplementedError":
                self.failed(exc)
            fail(
                f"your {module.cls}.forward could not be captured as a graph of PyTorch operations, which the grader "
                f"checks and times: {exc.type}: {capture_message(exc.message)}{trace}\n{CANNOT_CAPTURE}",
                mistake=CANNOT_CAPTURE,
                diagnosis=CANNOT_CAPTURE,
            )
        except WorkerError as exc:
            self.failed(exc)
        note("captured", what=f"{module.cls}.forward", operations=len(answer.graph.nodes))
        return answer

    def timed_calls(
        self, module: ModuleInfo, request: ForwardManyRequest, timeout: float, ready_seconds: float = 1.0
    ) -> TimedCalls:
        """Open one timed request of `module`'s forwards (`request`, made for its handle: its calls, on inputs the
        worker makes from seeds sent one per call, `client.TimedCalls`): per call, a (batch, tokens, 3) tensor of
        probes of the output. A forward that hangs here is not held against the untimed checks (its own target). Failures are
        left to the caller (`failed`), which handles them the same way for every timed worker."""
        return self.worker.timed_calls(
            request,
            min(self._timeout(), timeout),
            target=f"{module.cls}.forward",
            check=self._check(),
            ready_seconds=ready_seconds,
        )


def unparsed(worker: Worker, name: str) -> CellProblem | None:
    """When `name` is missing because the cell that defines it has a syntax error (the file loaded, that
    cell did not): where that cell is, and the error, in the file's lines; else None. Read from the cells'
    text and the load report, in this process: nothing of the file runs here."""
    report = worker.load_report
    for problem in report.errors if report is not None else []:
        if problem.type != "SyntaxError":
            continue
        for number, _line, source in worker.cells:
            if number == problem.cell and name in defined_names(str(source)):
                return problem
    return None


def constructor_changed(
    submission: Submission,
    cls: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    state_dict: dict[str, torch.Tensor] | None,
    dtype_name: str | None,
) -> str | None:
    """Why a build failed when the student's constructor is not the given one, in the student's terms: it
    takes the given arguments in another order (it builds when they are named) or takes others, or it
    makes other attributes than those the grader loads its weights into. None: the constructor is not the
    reason (the build's own failure says what is)."""
    target = f"{cls}.__init__"
    request = BuildRequest(cls, list(args), kwargs, None, dtype_name, submission.device)
    unloaded, problem = attempt(submission._ask, request, target=target)
    if problem is not None:
        names = given_arguments(cls)
        if names is None or len(args) > len(names):
            return None
        named = {**dict(zip(names, args)), **kwargs}
        built, by_name = attempt(submission._ask, replace(request, args=[], kwargs=named), target=target)
        given = f"{cls}{given_signature(cls)}"
        rule = f"the grader builds your {cls} with the given constructor's arguments, in their order: {given}"
        if built is not None:
            return f"{rule}; yours takes them in another order. Keep the given constructor as it is."
        if by_name and re.search(r"unexpected keyword argument|required positional argument", by_name.message):
            return f"{rule}; yours takes other arguments. Keep the given constructor as it is."
        return None
    if state_dict is not None and isinstance(unloaded, ModuleInfo) and unloaded.state_dict is not None:
        return constructor_problem(cls, state_dict, unloaded.state_dict)
    return None


def capture_message(message: str) -> str:
    """An error the capture raised, without torch's advice to whoever calls make_fx (not the student)."""
    sentences = re.split(r"(?<=[.!])\s+", message)
    kept = [s for s in sentences if not re.search(r"make_fx|tracing_mode|symbolic|guard_or|For more info", s)]
    return " ".join(kept) or message


REPLAYED = "the graph captured from your forward"  # the target of the replaying worker's requests


def replay_state(captured: Captured, known: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """The state a captured graph takes, in its inputs' order: the grader's own tensor wherever it loaded one
    under that name (never the worker's copy), else the one the worker sent."""
    state = []
    for name in captured.graph.inputs:
        tensor = known.get(name, captured.state.get(name))
        if tensor is None:
            fail(f"the captured forward takes a tensor the grader cannot supply ({name})", diagnosis=NOT_REPLAYABLE)
        state.append(tensor)
    return state


def replay(worker: Worker, captured: Captured, state: list[torch.Tensor], device: str) -> ModuleInfo:
    """The captured graph rebuilt in `worker`, a trusted worker that never ran student code (`ReplayRequest`): a
    module of its own there, whose forward runs only the graph. A graph that cannot be rebuilt is the student's
    (the grader checked its structure and operations: what is left is how they were called)."""
    try:
        answer = worker.request(ReplayRequest(captured.graph.to_wire(), state, device), target=REPLAYED)
    except SubmissionError as exc:
        fail(
            f"the graph captured from your forward could not be replayed: {exc.type}: {exc.message}",
            diagnosis=NOT_REPLAYABLE,
        )
    except (WorkerTimeout, WorkerCrashed) as exc:  # only this submission's graphs run in that worker
        fail(f"the graph captured from your forward could not be replayed: {exc}", diagnosis=NOT_REPLAYABLE)
    if not isinstance(answer, ModuleInfo):
        fail("the replaying worker did not describe the graph's module", diagnosis=NOT_REPLAYABLE)
    return answer


def replayed_forward(worker: Worker, module: ModuleInfo, x: torch.Tensor) -> object:
    """The replayed graph's output on `x`, in the trusted worker; a failure there is the graph's (the
    student's)."""
    try:
        answer = worker.request(ForwardRequest(module.handle, x), target=REPLAYED)
    except SubmissionError as exc:
        fail(
            f"the graph captured from your forward failed when replayed: {exc.type}: {exc.message}",
            diagnosis=NOT_REPLAYABLE,
        )
    except (WorkerTimeout, WorkerCrashed) as exc:
        fail(f"the graph captured from your forward did not run when replayed: {exc}", diagnosis=NOT_REPLAYABLE)
    if not isinstance(answer, ForwardReply):
        fail("the replaying worker did not answer with an output", diagnosis=NOT_REPLAYABLE)
    return answer.y


def _wire(value: Any) -> Any:
    """The grader's arguments for a request: a module living in the worker as its handle."""
    if isinstance(value, ModuleInfo):
        return Handle(value.handle)
    if isinstance(value, (list, tuple)):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value


def check_seed(run_seed: int, check_id: str) -> int:
    """The seed of one check's hidden inputs: a function of the run's seed and the check's id only, so
    `--seed N` reproduces any one check whatever else runs, in whatever order."""
    digest = hashlib.sha256(f"{run_seed}:{check_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def new_run_seed() -> int:
    return secrets.randbits(63)


class Inputs:
    """Hidden inputs for one check, from a seed the submission never sees."""

    def __init__(self, seed: int):
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator, dtype=torch.float64).to(dtype)

    def seed_value(self) -> int:
        return int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))

    def state_dict(self, module: torch.nn.Module, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """Random weights for `module` (overwritten in place, returned as a state dict): every
        parameter, biases included, at a scale where attention is neither uniform nor one-hot."""
        with torch.no_grad():
            for param in module.parameters():
                fan_in = param.shape[-1] if param.dim() > 1 else param.shape[0]
                param.copy_(self.randn(*param.shape) / fan_in**0.5 * 1.5)
        module.to(dtype)
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


DTYPE_NOT_KEPT = "the output does not keep the input's dtype (a hard-coded .float(), or a torch.float32 tensor?)"
# What went wrong with an output that names no likely mistake (`fail`'s diagnosis): the same for every case.
NOT_A_TENSOR, WRONG_SHAPE = "not a tensor", "the shape differs from the reference's"
WRONG_VALUES, NOT_FINITE = "the values differ from the reference's", "the output contains NaN or infinity"
NO_GRADIENTS = "no gradients came back: does the forward return a tensor connected to its input?"
OUT_OF_BUDGET = "the check's time budget was used up waiting for the code"
OTHER_DEVICE = "the output is not on the input's device"
Diagnose = Callable[[torch.Tensor], "str | None"]  # names the likely mistake behind a wrong output


def assert_close(
    actual: object,
    expected: torch.Tensor,
    dtype_name: str,
    rubric: Rubric,
    what: str,
    diagnose: Diagnose | None = None,
) -> None:
    """Fail unless `actual` is a tensor of `expected`'s shape and dtype, close within the rubric's
    tolerance. `diagnose(actual)` may name the likely mistake."""
    note("compared", what=what, expected=expected, actual=actual)
    if not isinstance(actual, torch.Tensor):
        fail(
            f"{what}: expected a tensor, got {type(actual).__name__} {actual!r:.80}",
            diagnosis=f"{NOT_A_TENSOR}: {type(actual).__name__}",
        )
    hint = diagnose(actual) if diagnose else None
    if tuple(actual.shape) != tuple(expected.shape):
        said = f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}."
        fail(explained(said, hint, hint) if hint else Failure(said, diagnosis=WRONG_SHAPE))
    if actual.dtype != expected.dtype:
        fail(explained(f"{what}: dtype {actual.dtype}, expected {expected.dtype}.", DTYPE_NOT_KEPT, DTYPE_NOT_KEPT))
    rtol, atol = rubric.tolerance(dtype_name)
    if not torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=False):
        diff = (actual.double() - expected.double()).abs()
        finite = torch.isfinite(actual).all()
        detail = (
            f"largest difference {diff.max().item():.3g} (tolerance {atol:g} + {rtol:g} x |expected|)"
            if finite
            else "your output contains NaN or infinity"
        )
        said = f"{what}: values differ from the reference; {detail}."
        fail(explained(said, hint, hint) if hint else Failure(said, diagnosis=WRONG_VALUES if finite else NOT_FINITE))


def matches(actual: object, candidate: torch.Tensor, atol: float = 1e-6) -> bool:
    return (
        isinstance(actual, torch.Tensor)
        and tuple(actual.shape) == tuple(candidate.shape)
        and torch.allclose(actual.double(), candidate.double(), rtol=1e-5, atol=atol)
    )


Variants = dict[str, "torch.Tensor | Callable[[], torch.Tensor]"]  # known wrong answers, by description


def first_match(actual: object, variants: Mapping[str, torch.Tensor | Callable[[], torch.Tensor]]) -> str | None:
    """The description of the first known wrong variant that `actual` equals, if any. A variant is a
    tensor or a function making one; a variant that cannot be computed for this input is skipped."""
    for description, candidate in variants.items():
        try:
            candidate = candidate() if callable(candidate) else candidate
        except (RuntimeError, ValueError, IndexError):
            continue
        if matches(actual, candidate):
            return description
    return None


def build_pair(
    submission: Submission,
    inputs: Inputs,
    reference_class: type[M],
    *args: Any,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
    **kwargs: Any,
) -> tuple[M, ModuleInfo]:
    """The reference module (of a class of reference/) with hidden random weights, and the student's class
    of the same name built with the same arguments and loaded with the same weights. The reference is in
    eval mode."""
    reference = reference_class(*args, **kwargs)
    state = inputs.state_dict(reference, dtype)
    reference = reference.to(device).eval()
    module = submission.build(reference_class.__name__, *args, state_dict=state, dtype=dtype, **kwargs)
    return reference, module


def seed_torch(seed: int) -> None:
    """What `torch.manual_seed(seed)` does for the devices a grading uses: the CPU's generator, and CUDA's
    once CUDA is in use (the reference's modules are on the device before anything is drawn there).
    `torch.manual_seed` also queues the seed for every accelerator not initialised yet, formatting the
    caller's whole stack for each: milliseconds per call under pytest, a quarter of a second per grading."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch declares no types for it
        torch.cuda.manual_seed_all(seed)


def backward(y: torch.Tensor, grad_out: torch.Tensor) -> None:
    """`y.backward(grad_out)`, as the backward of the scalar sum(y * grad_out), as the worker runs it: the same
    gradients to the last bit, without what `backward` with an explicit gradient imports on its first call
    (torch's symbolic shapes and sympy: a quarter of a second of CPU in each grading from the command line)."""
    (y * grad_out).sum().backward()  # type: ignore[no-untyped-call]  # torch declares no types for it


def reference_cost(compute: Callable[[], R]) -> tuple[R, float]:
    """`compute()`, the reference's side of a request run here, and the CPU seconds this process spent on it (all
    its threads): what the same request of the student's may spend is a multiple of it (`Submission.forward`)."""
    start = time.process_time()
    value = compute()
    return value, time.process_time() - start


def reference_forward(module: torch.nn.Module, x: torch.Tensor, *, train: bool = False, seed: int = 0) -> torch.Tensor:
    """The reference's output on x, on the module's device; in training mode, dropout drawn from `seed`.
    A dropout draw matches the worker's only on the same device: CPU and CUDA generators seeded alike
    draw different masks (a check in training mode keeps its reference on the grading device)."""
    module.train(train)
    seed_torch(seed)
    with torch.no_grad():
        y: torch.Tensor = module(x)
    module.eval()
    return y


def dtypes_for(device: str) -> list[str]:
    return ["float64", "float32"] if device == "cpu" else ["float32", "bfloat16", "float16"]


def book_batch() -> torch.Tensor:
    """The book's running example, "Your journey starts with one step" as six 3-D embeddings, twice."""
    from reference import mha as ref

    batch: torch.Tensor = ref.batch.clone()  # (2, 6, 3)
    return batch


def book_pair(submission: Submission, reference_class: type[M], *args: Any) -> tuple[M, ModuleInfo, torch.Tensor]:
    """The book's setting: the reference built right after torch.manual_seed(123), the student's
    class of the same name given the same weights (float32), and the book's batch."""
    seed_torch(123)
    reference = reference_class(*args).eval()
    module = submission.build(reference_class.__name__, *args, state_dict=reference.state_dict(), dtype=torch.float32)
    return reference, module, book_batch()


def check_gradients(
    answer: ForwardReply, expected: Mapping[str, torch.Tensor | None], rubric: Rubric, dtype_name: str = "float64"
) -> None:
    """Compare the worker's gradients (keys "x" and "param:<name>") with the reference's."""
    if answer.grad_problem:
        fail(answer.grad_problem)
    got = answer.grads
    if got is None:
        fail(NO_GRADIENTS, diagnosis=NO_GRADIENTS)
    for name, grad in expected.items():
        label = "the input x" if name == "x" else name.removeprefix("param:")
        mine = got.get(name)
        if mine is None:
            fail(
                f"no gradient reached {label}: is it used in the computation, without .detach() or torch.no_grad()?",
                diagnosis=f"no gradient reached {label}",
            )
        if grad is None:  # the grader's own fault: the run cannot grade
            raise RuntimeError(f"the reference has no gradient for {label}")
        assert_close(mine, grad, dtype_name, rubric, f"gradient of {label}")


# -- Charging a mistake once, in the student's terms ------------------------------------------------
# A later part that uses an earlier one (the wrapper calls combine, fuse_heads may call
# head_column_ranges) is graded on what it adds; when it cannot be, its message names the earlier
# part. A check of a property (no input mutation, dtype kept, gradients, structure) counts only when
# the part's values are right on the check's own case.


def attempt(request: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> tuple[R | None, Failure | None]:
    """Run one Submission request: (its answer, None), or (None, the message the check would have failed
    with), so that a check can explain a failure before reporting it. A check that cannot be scored at all
    (`NotCredited`) stays so."""
    try:
        return request(*args, **kwargs), None
    except NotCredited:
        raise
    except pytest.fail.Exception as exc:
        return None, Failure.of(exc)


def value_problem(
    actual: object,
    expected: torch.Tensor,
    dtype_name: str,
    rubric: Rubric,
    what: str,
    diagnose: Diagnose | None = None,
) -> Failure | None:
    """The failure `assert_close` would fail with, or None when `actual` is right."""
    try:
        assert_close(actual, expected, dtype_name, rubric, what, diagnose)
    except pytest.fail.Exception as exc:
        return Failure.of(exc)
    return None


def values_first(problem: Failure | None, what: str) -> None:
    """A property check whose case's output is wrong is not credited: a property of a wrong answer earns
    nothing, and the check accuses the code of nothing of its own (its name may say "no loop over heads"
    of code that has no loop). The reason keeps what is wrong with the output, not the likely mistake,
    which the value checks name."""
    if problem is not None:
        # what differed, where the message says it before its likely mistake; else all of it
        before = problem.detail.removesuffix(f"\n{LIKELY_MISTAKE}")
        wrong = before if before != problem.detail else problem.message
        raise NotCredited(
            f"not credited: {what[:1].lower()}{what[1:]} counts only once the output on this check's input is right, "
            f"and it is not yet ({wrong})"
        )


def join_names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def attribute_names(state: dict[str, Any]) -> list[str]:
    """The attributes a state dict's keys live in: submodules first (W_query, ..., out_proj), then the
    module's own tensors (mask), each in the order the constructor made them."""
    names = dict.fromkeys(key.split(".")[0] for key in state)
    return [n for n in names if any(k.startswith(f"{n}.") for k in state)] + [n for n in names if n in state]


def given_arguments(cls: str) -> list[str] | None:
    """The arguments of the given constructor of `cls` (the reference's class of that name), in order."""
    signature = given_signature(cls)
    return list(signature.parameters) if signature is not None else None


def given_signature(cls: str) -> inspect.Signature | None:
    from reference import mha as ref

    given = getattr(ref, cls, None)
    return inspect.signature(given) if isinstance(given, type) else None


def shapes_of(keys: list[str], state: dict[str, Any]) -> str:
    return join_names([f"{key} {tuple(getattr(state[key], 'shape', ()))}" for key in keys])


def constructor_problem(cls: str, given: dict[str, Any], yours: dict[str, Any]) -> str | None:
    """Why the grader's weights (`given`, the state dict of the reference's given constructor) cannot be
    loaded into the student's module (`yours`, its own state dict), in the student's terms; None when the
    names and shapes agree. The notebook's self-check of part 6 says the same words."""
    given_names, your_names = attribute_names(given), attribute_names(yours)
    missing = [n for n in given_names if n not in your_names]
    extra = [n for n in your_names if n not in given_names]
    rule = (
        f"the grader loads its hidden weights into {join_names(given_names)}, the attributes the given "
        f"constructor makes, so that your {cls} and the reference compute with the same weights"
    )
    if extra and missing:
        found = f"your {cls} has {join_names(extra)} instead of {join_names(missing)}"
    elif missing:
        found = f"your {cls} has no {join_names(missing)}"
    elif extra:
        found = f"your {cls} also has {join_names(extra)}, which the grader cannot fill"
    elif set(given) != set(yours):  # the same attributes, made otherwise (raw tensors instead of layers?)
        absent, added = [k for k in given if k not in yours], [k for k in yours if k not in given]
        found = (
            f"your {cls} holds {shapes_of(added, yours)} where the given constructor holds {shapes_of(absent, given)}"
            if absent and added
            else f"your {cls} has no {join_names(absent)}"
            if absent
            else f"your {cls} also has {join_names(added)}, which the grader cannot fill"
        )
    else:
        shapes = [
            f"{key} is {tuple(yours[key].shape)} in yours, {tuple(value.shape)} in the given constructor"
            for key, value in given.items()
            if key in yours and tuple(getattr(yours[key], "shape", ())) != tuple(value.shape)
        ]
        if not shapes:
            return None
        found = f"the shapes differ: {'; '.join(shapes)}"
    return f"{rule}; {found}. Keep the given constructor as it is and write only forward."


MASK_NOT_CUT = (
    "the causal mask is context_length x context_length, so cut it to T x T "
    "(self.mask.bool()[:num_tokens, :num_tokens]) and sequences shorter than context_length work"
)
IN_PLACE = "{function} changes a tensor in place that gradients need (its input x?): work on new tensors instead"
_SIZE_ERROR = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")
_INTERNAL_ERRORS = (
    (
        "dtype",
        re.compile(
            r"same dtype|expected scalar type|dtype mismatch|Input type .* weight type|"
            r"expected m1 and m2|mat1 and mat2 must have the same dtype|can't be cast",
            re.I,
        ),
        "{function} mixes dtypes: a tensor or a module it uses does not have the input's dtype. Keep every "
        "parameter in the module's dtype, and create new tensors with the input's dtype (dtype=x.dtype)",
    ),
    (
        "device",
        re.compile(r"same device|Expected all tensors to be on", re.I),
        "{function} mixes devices: a tensor or a module it uses is not on the input's device. Create new "
        "tensors on x.device, and keep modules on the device they were given",
    ),
    (
        "grad",
        re.compile(r"does not require grad and does not have a grad_fn", re.I),
        "{function}'s output is not connected to its input and weights, so no gradient can reach them: no "
        ".detach(), .data or torch.no_grad(), and no new tensor built from plain numbers",
    ),
    (
        "inplace",
        re.compile(
            r"leaf Variable that requires grad is being used in an in-place operation|"
            r"modified by an inplace operation",
            re.I,
        ),
        IN_PLACE,
    ),
    (
        "view",
        re.compile(r"view size is not compatible with input tensor's size and stride", re.I),
        "{function} calls .view() on a tensor that is no longer laid out row by row (after a transpose): "
        "use .contiguous().view(...) or .reshape(...)",
    ),
)


def in_student_terms(
    failure: Failure, function: str, *, tokens: int | None = None, context_length: int | None = None
) -> Failure:
    """A failure with PyTorch's internal errors (a mask not cut to T x T, dtypes, devices, gradients, in-place
    changes, views) explained in the student's terms, naming the function to fix. A failure that is no such error
    comes back as it is (the same object)."""
    message = failure.message
    size = _SIZE_ERROR.search(message)
    if (
        size
        and tokens is not None
        and context_length is not None
        and tokens != context_length
        and {int(size.group(1)), int(size.group(2))} == {tokens, context_length}
    ):
        return explained(
            "",
            f"{function} fails for {tokens} tokens when context_length is {context_length}: {MASK_NOT_CUT}.\n{message}",
            MASK_NOT_CUT,
        )
    for _, pattern, text in _INTERNAL_ERRORS:
        if pattern.search(message):
            said = text.format(function=function)
            return explained("", f"{said}.\n{message}", said)
    return failure


def forward_checked(
    submission: Submission,
    module: ModuleInfo,
    x: torch.Tensor,
    *,
    function: str,
    context_length: int | None = None,
    explain: Callable[[str], str | None] | None = None,
    **kwargs: Any,
) -> ForwardReply:
    """`submission.forward`, failing with internal errors put in the student's terms; `explain` names the
    known mistake that raises the same error on this input, if any (the part's own variants)."""
    answer, problem = attempt(submission.forward, module, x, **kwargs)
    if answer is None:
        failure = problem or Failure("")
        said = in_student_terms(
            failure, function, tokens=x.shape[1] if x.dim() == 3 else None, context_length=context_length
        )
        unexplained = said is failure  # in_student_terms found no internal error to explain
        mistake = explain(said.message) if explain is not None and unexplained else None
        fail(explained("", f"{mistake}.\n{said}", mistake) if mistake else said)
    return answer
