"""Long-lived grading processes: each grades many submissions in turn, each with its own fresh worker.

Starting Python, importing torch and pytest, and collecting the checks cost the trusted grader a few
seconds; paid once per process instead of once per submission, they no longer dominate a class.
Nothing about isolation changes: the grader only ever runs trusted code, and every submission still
gets fresh worker processes (started, jailed and killed by `grade.grade_submission`, exactly as for
`python -m autograder grade`). What the process keeps from one grading to the next is its own and the
reference's: the speed part's two timing workers that only ever run the reference's code
(`timing.kept_trusted_workers`).

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

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
PARENT_VARIABLE = "AUTOGRADER_POOL_PARENT"


# -- both sides ----------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (through /proc's parent links), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as handle:
                    text = handle.read()
            except OSError:
                continue
            ppid = int(text[text.rfind(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def kill_tree(pid: int, include_self: bool = True):
    """SIGKILL `pid`'s descendants and their process groups (a worker leads its own session), then `pid`."""
    for child in descendants(pid):
        for kill in (os.killpg, os.kill):
            try:
                kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    if include_self:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def die_with_parent(signum: int = signal.SIGTERM):
    """Ask the kernel to send `signum` to this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# -- the grading process --------------------------------------------------------------------------


def serve(stdin=None, replies=None) -> int:
    """Grade the jobs read from stdin, one JSON object a line; answer each with one line."""
    replies = replies or os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the answers
    sys.stdout = sys.stderr

    def on_term(signum, frame):
        kill_tree(os.getpid(), include_self=False)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the class run's to handle: it stops us
    parent = os.environ.get(PARENT_VARIABLE)
    if parent and os.getppid() != int(parent):  # the class run died before we asked to die with it
        return 1

    from autograder.grading.grade import Options, grade_submission, write_results

    for line in stdin or sys.stdin:
        job = json.loads(line)
        started = time.monotonic()
        options = Options(
            device=job["device"],
            out=Path(job["out"]),
            rubric_path=Path(job["rubric"]),
            quiet=True,
            isolation=job.get("isolation", "auto"),
            parts=tuple(job["parts"]) if job.get("parts") else None,
            keep_timing_workers=True,
        )
        run = grade_submission(Path(job["submission"]), options)
        write_results(options.out, run)
        replies.write(
            json.dumps({"id": job["id"], "status": run.status, "seconds": round(time.monotonic() - started, 3)}) + "\n"
        )
    return 0


# -- the class side ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: bool  # the process answered (results.json was written)
    problem: str = ""  # why not
    seconds: float = 0.0


class Grader:
    """One long-lived grading process, restarted on trouble. Use from one thread at a time."""

    def __init__(self, env: dict[str, str] | None = None, jobs_per_process: int = 25):
        self.env = dict(os.environ if env is None else env)
        self.jobs_per_process = jobs_per_process
        self.process: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()
        self.buffer = b""
        self.done = 0
        self.starts = 0

    def _start(self):
        env = dict(self.env)
        env[PARENT_VARIABLE] = str(os.getpid())
        # Idle OpenMP threads sleep rather than spin while the grader waits for its worker: spinning
        # cost about 3.5 s of CPU per submission, taken from the submissions graded beside it.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.log.seek(0)
        self.log.truncate()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autograder.course.grading_pool"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            preexec_fn=die_with_parent,
        )
        self.buffer, self.done = b"", 0
        self.starts += 1

    def grade(self, job: dict, timeout: float) -> Outcome:
        if self.process is None or self.process.poll() is not None or self.done >= self.jobs_per_process:
            self.close()
            self._start()
        started = time.monotonic()
        try:
            self.process.stdin.write((json.dumps(job) + "\n").encode())
            self.process.stdin.flush()
            line = self._read_line(started + timeout)
        except (BrokenPipeError, OSError):
            line = None
        seconds = time.monotonic() - started
        if line is None:
            if self.process.poll() is None:
                problem = f"grading took more than {timeout:g} s and was stopped"
            else:
                problem = f"the grading process ended unexpectedly (exit status {self.process.returncode})"
                tail = self._log_tail()
                if tail:
                    problem += f": {tail}"
            self.close()
            return Outcome(False, problem, seconds)
        self.done += 1
        return Outcome(True, "", seconds)

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self.process.stdout.fileno()
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

    def close(self):
        if self.process is None:
            return
        if self.process.poll() is None:
            kill_tree(self.process.pid)
        else:
            kill_tree(self.process.pid, include_self=False)
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.process = None


if __name__ == "__main__":
    sys.exit(serve())
