"""Long-lived grading processes: each grades many submissions in turn, each with its own fresh worker.

Starting Python, importing torch and pytest, and collecting the checks cost the trusted grader a few
seconds; paid once per process instead of once per submission, they no longer dominate a class.
Nothing about isolation changes: the grader only ever runs trusted code, and every submission still
gets fresh worker processes (started, jailed and killed by `grade.grade_submission`, exactly as for
`python -m autograder grade`). What the process keeps from one grading to the next is its own and the
reference's: the speed part's two timing workers that only ever run the reference's code
(`timing.KeptWorkers`).

`Grader` (the class side) drives one such process: it sends a job (one line of JSON on the process's
stdin), waits for its answer (one line on its stdout) at most `timeout` seconds, and on any trouble (a
timeout, the process dying) kills the process and everything it started, reports why, and starts a
fresh process for the next job. The process is also replaced every `jobs_per_process` jobs, so
nothing one run leaves behind can build up.

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any, TextIO

from autograder.course.store import COURSE_FILE_MODE
from autograder.sandbox import procfs

PARENT_VARIABLE = "AUTOGRADER_POOL_PARENT"


# -- the grading process --------------------------------------------------------------------------


def serve(stdin: Iterable[str] | None = None, replies: TextIO | None = None) -> int:
    """Grade the jobs read from stdin, one JSON object a line; answer each with one line."""
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

    replies.write(json.dumps({"ready": os.getpid()}) + "\n")  # imported: the next process may start (`Grader`)
    with KeptWorkers() as kept:  # the reference's timing workers, kept from one grading to the next
        for line in stdin or sys.stdin:
            job = json.loads(line)
            started = time.monotonic()
            out = Path(job["out"])
            options = Options(
                device=job["device"],
                out=out,
                rubric_path=Path(job["rubric"]),
                quiet=True,
                isolation=job.get("isolation", "auto"),
                parts=tuple(job["parts"]) if job.get("parts") else None,
                kept_workers=kept,
            )
            run = grade_submission(Path(job["submission"]), options)
            write_results(out, run, COURSE_FILE_MODE)
            seconds = round(time.monotonic() - started, 3)
            replies.write(json.dumps({"id": job["id"], "status": run.status, "seconds": seconds}) + "\n")
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
            self._read_answer(_pipe(self.process.stdout).fileno(), time.monotonic() + READY_SECONDS, ready=True)
        return self.process

    def grade(self, job: dict[str, Any], timeout: float) -> JobAnswer:
        process = self.process
        if process is None or process.poll() is not None or self.done >= self.jobs_per_process:
            self.close()
            process = self._start()
        started = time.monotonic()
        self.busy = True
        try:
            stdin = _pipe(process.stdin)
            stdin.write((json.dumps(job) + "\n").encode())
            stdin.flush()
            line = self._read_answer(_pipe(process.stdout).fileno(), started + timeout)
        except (BrokenPipeError, OSError):
            line = None
        seconds = time.monotonic() - started
        if line is None:
            if process.poll() is None:
                problem = f"grading took more than {timeout:g} s and was stopped"
            else:
                problem = f"the grading process ended unexpectedly (exit status {process.returncode})"
                tail = self._log_tail()
                if tail:
                    problem += f": {tail}"
            self.close()
            return JobAnswer(False, problem, seconds)
        self.busy = False
        self.done += 1
        return JobAnswer(True, "", seconds)

    def _read_answer(self, fd: int, deadline: float, ready: bool = False) -> bytes | None:
        """The process's next answer to a job (`ready`: its line saying it has imported), or None by the
        deadline; a late "ready" line is passed over."""
        while True:
            line = self._read_line(fd, deadline)
            if line is None or ready or not line.startswith(b'{"ready"'):
                return line

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
