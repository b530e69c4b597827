"""Long-lived grading processes: each grades many submissions in turn, each with its own fresh worker.

Starting Python, importing torch and pytest, and collecting the checks cost the trusted grader a few
seconds; paid once per process instead of once per submission, they no longer dominate a class.
Nothing about isolation changes: the grader only ever runs trusted code, and every submission still
gets fresh worker processes (started, jailed and killed by `grade.grade_submission`, exactly as for
`python -m autograder grade`). What the process keeps from one grading to the next is its own and the
reference's: the speed part's two timing workers that only ever run the reference's code
(`timing.KeptWorkers`).

`Grader` (the class side) drives one such process: it sends a job (a `GradingJob`, one line of JSON on the
process's stdin), waits for its answer (a `JobReply`, one line on its stdout) at most `timeout` seconds, and on any trouble (a
timeout, the process dying) kills the process and everything it started, reports why, and starts a
fresh process for the next job. The process is also replaced every `jobs_per_process` jobs, so
nothing one run leaves behind can build up.

What crosses the pipes is typed: a `GradingJob` in, the process's first line a `Ready`, then one `JobReply` a
job, each a frozen dataclass with its wire form (`to_wire`, `from_wire`), checked field by field when read. A
line from the process that is not one of its messages, or a reply to another job, is the process's fault: it
is stopped, and the student gets a run that could not grade, saying why.

The process dies with the class run: it asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG), and on SIGTERM kills its worker and exits, so `kill -9` of the class run leaves
no grader behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, TextIO, get_args

from autograder.course.store import COURSE_FILE_MODE
from autograder.model import RunStatus
from autograder.sandbox import procfs

PARENT_VARIABLE = "AUTOGRADER_POOL_PARENT"


# -- what crosses the pipes -------------------------------------------------------------------------


class WireError(ValueError):
    """A line between the class run and a grading process that is not the message it should be."""


def _fields(line: str | bytes, what: str, required: Mapping[str, type], optional: Mapping[str, type]) -> dict[str, Any]:
    """A line's JSON object, every field of the type given (an int is no bool; a float may be an int), and no
    field besides."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"{what}: not a line of JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WireError(f"{what}: not a JSON object")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise WireError(f"{what}: unknown field {unknown[0]!r}")
    missing = sorted(set(required) - set(data))
    if missing:
        raise WireError(f"{what}: field {missing[0]!r} is missing")
    for name, kind in {**required, **optional}.items():
        value = data.get(name)
        kinds = (int, float) if kind is float else kind
        if name in data and (not isinstance(value, kinds) or (isinstance(value, bool) and kind is not bool)):
            raise WireError(f"{what}: field {name!r} is not {kind.__name__}")
    return data


@dataclass(frozen=True)
class GradingJob:
    """One submission for a grading process to grade, and where to write its results.json."""

    id: str  # the student: the reply names it
    submission: Path
    out: Path
    device: str
    rubric: Path
    isolation: str = "auto"
    parts: tuple[str, ...] | None = None  # only these parts (the tests' pool: the speed part alone); None: all

    def to_wire(self) -> str:
        data: dict[str, Any] = {
            "id": self.id,
            "submission": str(self.submission),
            "out": str(self.out),
            "device": self.device,
            "rubric": str(self.rubric),
            "isolation": self.isolation,
        }
        if self.parts is not None:
            data["parts"] = list(self.parts)
        return json.dumps(data) + "\n"

    @classmethod
    def from_wire(cls, line: str | bytes) -> GradingJob:
        text = {"id": str, "submission": str, "out": str, "device": str, "rubric": str}
        data = _fields(line, "a grading job", text, {"isolation": str, "parts": list})
        parts = data.get("parts")
        if parts is not None and not all(isinstance(part, str) for part in parts):
            raise WireError("a grading job: field 'parts' is not a list of part ids")
        return cls(
            id=data["id"],
            submission=Path(data["submission"]),
            out=Path(data["out"]),
            device=data["device"],
            rubric=Path(data["rubric"]),
            isolation=data.get("isolation", "auto"),
            parts=tuple(parts) if parts else None,
        )


@dataclass(frozen=True)
class Ready:
    """A grading process's first line: it has imported torch and the grader (the next process may start)."""

    pid: int

    def to_wire(self) -> str:
        return json.dumps({"ready": self.pid}) + "\n"


@dataclass(frozen=True)
class JobReply:
    """A grading process's answer to a job: it wrote results.json (its `GradingRun`'s status), in `seconds`."""

    id: str  # the job's
    status: RunStatus
    seconds: float

    def to_wire(self) -> str:
        return json.dumps({"id": self.id, "status": self.status, "seconds": self.seconds}) + "\n"


def read_reply(line: str | bytes) -> Ready | JobReply:
    """A line from a grading process as its message, checked (it is the process's word, not to be trusted
    blindly): WireError when it is neither."""
    try:
        first = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        first = None
    if isinstance(first, dict) and "ready" in first:
        pid = _fields(line, "a ready line", {"ready": int}, {})["ready"]
        return Ready(pid)
    data = _fields(line, "a grading process's reply", {"id": str, "status": str, "seconds": float}, {})
    if data["status"] not in get_args(RunStatus):
        raise WireError(f"a grading process's reply: no such status {data['status'][:40]!r}")
    if not 0 <= data["seconds"] < float("inf"):
        raise WireError("a grading process's reply: field 'seconds' is not a time")
    return JobReply(data["id"], data["status"], data["seconds"])


# -- the grading process --------------------------------------------------------------------------


def serve(stdin: Iterable[str] | None = None, replies: TextIO | None = None) -> int:
    """Grade the jobs read from stdin (`GradingJob`, one a line); say `Ready` first, and answer each job with
    its `JobReply`."""
    replies = replies or os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the answers
    sys.stdout = sys.stderr

    def on_term(signum: int, frame: FrameType | None) -> None:
        procfs.kill_tree(procfs.tree_of(os.getpid(), include_self=False))
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the class run's to handle: it stops us
    parent = os.environ.get(PARENT_VARIABLE)
    if parent and os.getppid() != int(parent):  # the class run died before we asked to die with it
        return 1

    from autograder.grading.grade import Options, grade_submission
    from autograder.grading.timing import KeptWorkers
    from autograder.model import write_results

    replies.write(Ready(os.getpid()).to_wire())  # imported: the next process may start (`Grader`)
    with KeptWorkers() as kept:  # the reference's timing workers, kept from one grading to the next
        for line in stdin or sys.stdin:
            job = GradingJob.from_wire(line)
            started = time.monotonic()
            options = Options(
                device=job.device,
                out=job.out,
                rubric_path=job.rubric,
                quiet=True,
                isolation=job.isolation,
                parts=job.parts,
                kept_workers=kept,
            )
            run = grade_submission(job.submission, options)
            write_results(job.out, run, COURSE_FILE_MODE)
            replies.write(JobReply(job.id, run.status, round(time.monotonic() - started, 3)).to_wire())
    return 0


# -- the class side ---------------------------------------------------------------------------------


@dataclass
class JobAnswer:
    """What came of one job sent to a grading process: whether it answered, and if not, why (not to be
    confused with the grading itself, `model.GradingRun`, which the process wrote to results.json)."""

    ok: bool  # the process answered (results.json was written)
    problem: str = ""  # why not
    seconds: float = 0.0


# One grading process of a class run starts at a time: it imports torch and the grader, a few CPU-seconds, and
# the next starts once it says it has (its first line). Started all at once, they shared the machine's cores
# and each reached its first grading, and the first timing of the class, only once all had imported (8 to 11 s
# into a class of 20 on 2 cores, against 4.5 s when started in turn); the device's timing lock lets one grading
# time at a time, so a class run ends no sooner than its first timing plus all of them.
STARTING = threading.Lock()
READY_SECONDS = 120.0  # at most this long for a process to say it has imported; then the next starts anyway
# An idle process told to end (its input closed) closes its kept workers, which removes their scratch folders
# and what their uids left, then exits; killed, it left them behind (two scratch folders in /tmp a process)
ENDING_SECONDS = 60.0


class Grader:
    """One long-lived grading process, restarted on trouble. Use from one thread at a time."""

    def __init__(self, env: dict[str, str] | None = None, jobs_per_process: int = 25):
        self.env = dict(os.environ if env is None else env)
        self.jobs_per_process = jobs_per_process
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.TemporaryFile()
        self.buffer = b""
        self.done = 0
        self.starts = 0
        self.busy = False  # a job was sent and not answered

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        env[PARENT_VARIABLE] = str(os.getpid())
        # Idle OpenMP threads sleep rather than spin while the grader waits for its worker: spinning
        # cost about 3.5 s of CPU per submission, taken from the submissions graded beside it.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.log.seek(0)
        self.log.truncate()
        with STARTING:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autograder.course.grading_pool"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                env=env,
                preexec_fn=functools.partial(procfs.die_with_parent, signal.SIGTERM),  # dies with the class run
            )
            self.buffer, self.done = b"", 0
            self.starts += 1
            with contextlib.suppress(WireError):  # not its ready line: the reply to its first job will say
                self._read_answer(_pipe(self.process.stdout).fileno(), time.monotonic() + READY_SECONDS, ready=True)
        return self.process

    def grade(self, job: GradingJob, timeout: float) -> JobAnswer:
        process = self.process
        if process is None or process.poll() is not None or self.done >= self.jobs_per_process:
            self.close()
            process = self._start()
        started = time.monotonic()
        self.busy = True
        problem = ""
        try:
            stdin = _pipe(process.stdin)
            stdin.write(job.to_wire().encode())
            stdin.flush()
            reply = self._read_answer(_pipe(process.stdout).fileno(), started + timeout)
        except WireError as exc:
            reply, problem = None, f"the grading process answered something else than its reply: {exc}"
        except (BrokenPipeError, OSError):
            reply = None
        seconds = time.monotonic() - started
        if isinstance(reply, JobReply) and reply.id != job.id:
            reply, problem = None, "the grading process answered for another job than the one it was sent"
        if reply is None:
            problem = problem or self._no_reply(process, timeout)
            self.close()
            return JobAnswer(False, problem, seconds)
        self.busy = False
        self.done += 1
        return JobAnswer(True, "", seconds)

    def _no_reply(self, process: subprocess.Popen[bytes], timeout: float) -> str:
        """Why a process sent no reply: it overran, or it ended (its last words)."""
        if process.poll() is None:
            return f"grading took more than {timeout:g} s and was stopped"
        tail = self._log_tail()
        return f"the grading process ended unexpectedly (exit status {process.returncode})" + (
            f": {tail}" if tail else ""
        )

    def _read_answer(self, fd: int, deadline: float, ready: bool = False) -> Ready | JobReply | None:
        """The process's next message: with `ready`, its first (`Ready`, once it has imported), else its reply
        to the job sent, a late `Ready` passed over; None by the deadline. WireError for a line that is
        neither."""
        while True:
            line = self._read_line(fd, deadline)
            if line is None:
                return None
            message = read_reply(line)
            if ready or not isinstance(message, Ready):
                return message

    def _read_line(self, fd: int, deadline: float) -> bytes | None:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _log_tail(self) -> str:
        self.log.seek(0)
        lines = self.log.read()[-4000:].decode("utf-8", "replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        """End the process: an idle one by closing its input, so that it closes its workers itself (`serve`),
        and whatever is still running then, or of a busy one, stopped whole and killed."""
        if self.process is None:
            return
        if not self.busy and self.process.poll() is None:
            with contextlib.suppress(OSError):
                _pipe(self.process.stdin).close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(ENDING_SECONDS)
        self.busy = False
        if self.process.poll() is None:
            procfs.kill_tree(procfs.tree_of(self.process.pid))  # stopped whole, then killed
        else:
            procfs.kill_tree(procfs.tree_of(self.process.pid, include_self=False))
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.process = None


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:  # never: `_start` pipes both
        raise OSError("the grading process has no pipe")
    return stream


if __name__ == "__main__":
    sys.exit(serve())
